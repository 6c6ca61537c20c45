"""`gpuaas gangs`: all-or-nothing placement of pod groups (scoring/gangs.py decides; docs/gangs.md). A controller that
pins the members of a gang to their planned nodes while they are gated and then removes its gate from all of them,
and a mutating admission webhook that gates the members of a group at creation."""
