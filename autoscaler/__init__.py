"""autoscaler: replica and GPU node-group autoscaling."""
