"""The one config loader: file, then environment, then flags; every mistake named."""
from __future__ import annotations

import re

import pytest

from extender.config import ENV_PREFIX, ExtenderConfig
from runtime.config import ConfigError, load_config


def test_file_then_environment_then_overrides(tmp_path):
    path = tmp_path / "extender.yaml"
    path.write_text("port: 9000\nhost: 0.0.0.0\npolicy: fgd\nlog_level: DEBUG\n"
                    "tls: {cert_file: /a.crt, key_file: /a.key, client_ca_file: /ca.crt}\n")
    env = {f"{ENV_PREFIX}PORT": "9100", f"{ENV_PREFIX}TLS__KEY_FILE": "/b.key", "UNRELATED": "x"}
    config = load_config(ExtenderConfig, path, env_prefix=ENV_PREFIX, environ=env, overrides={"policy": "bestfit",
                                                                                                "host": None})
    assert config.port == 9100  # environment over file
    assert config.policy == "bestfit"  # flag over both
    assert config.host == "0.0.0.0"  # an unset flag does not override the file
    assert str(config.tls.cert_file) == "/a.crt" and str(config.tls.key_file) == "/b.key"  # nested merge
    assert config.log_level == "DEBUG"


@pytest.mark.parametrize("text,env,message", [
    ("prot: 9000\n", {}, "prot: unknown field"),
    ("port: -1\n", {}, "port: Input should be greater than or equal to 0"),
    ("policy: tetris\n", {}, "policy 'tetris' is not one of"),
    ("", {f"{ENV_PREFIX}PORT": "eighty"}, "port: Input should be a valid integer"),
    ("- a\n- b\n", {}, "expected a mapping of settings"),
    ("port: [\n", {}, "not valid YAML"),
])
def test_bad_configuration_is_refused_naming_source_and_field(tmp_path, text, env, message):
    path = tmp_path / "extender.yaml"
    path.write_text(text)
    with pytest.raises(ConfigError) as err:
        load_config(ExtenderConfig, path, env_prefix=ENV_PREFIX, environ=env)
    assert message in str(err.value)
    assert str(path) in str(err.value)


def test_missing_file_is_named(tmp_path):
    with pytest.raises(ConfigError, match=re.escape("nope.yaml: No such file")):
        load_config(ExtenderConfig, tmp_path / "nope.yaml", env_prefix=ENV_PREFIX, environ={})
