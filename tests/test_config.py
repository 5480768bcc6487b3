"""Config loading: defaults, two-pass validation, errors naming file/field/value, the example file."""

from __future__ import annotations

import tomllib
from pathlib import Path

import pytest
from pydantic import BaseModel

from slurm_fleetyield import config
from slurm_fleetyield.config import Config, ConfigError, example_toml, load, read_secret

EXAMPLE = Path(__file__).parents[1] / "contrib" / "fleetyield.example.toml"


def write(tmp_path: Path, text: str) -> Path:
    path = tmp_path / "fy.toml"
    path.write_text(text)
    return path


def test_empty_file_is_all_defaults(tmp_path):
    cfg = load(write(tmp_path, ""))
    assert cfg == Config()
    assert cfg.sense.url_template == "http://{node}:9400/metrics" and not cfg.push.active


def test_values_are_read(tmp_path):
    cfg = load(
        write(
            tmp_path,
            '[slurm]\ndry_run = true\nbin_dir = "/opt/slurm/bin"\n[push]\nsecret_file = "/etc/fy/secret"\n'
            "[core.quarantine]\ndrain_cap_fraction = 0.2\n",
        )
    )
    assert cfg.slurm.dry_run and cfg.slurm.bin_dir == "/opt/slurm/bin" and cfg.push.active
    assert cfg.core.quarantine.drain_cap_fraction == 0.2


@pytest.mark.parametrize(
    ("text", "expected"),
    [
        ("[loop]\ninterval_s = -5\n", "loop.interval_s: Input should be greater than 0 (got -5)"),
        ('[sense]\nurl_template = "http://x/metrics"\n', "url_template must contain '{node}'"),
        ("[slurm]\ndry_rn = true\n", "slurm.dry_rn: Extra inputs are not permitted (got True)"),
        ("[push]\nenabled = true\n", "secret_file is required"),
        ("[loop]\nbackoff_initial_s = 10\nbackoff_max_s = 1\n", "backoff_max_s=1.0 is below"),
        ('[core.risk]\nsignals = ["bogus"]\n', "unknown risk signal 'bogus'"),
        ('[sense]\nhostname_label = "HOST"\n', "sense.hostname_label"),
        ('[api]\nport = 9402\n[push]\nsecret_file = "s"\n', "push.port and api.port are both 9402"),
        ("[loop\n", "not valid TOML"),
        (
            '[store]\nurl = "mysql://u:pw@db/fy"\n',
            "store.url: Value error, must be a postgresql:// URL, got 'db/fy'",
        ),
        (
            "[store]\nlease_ttl_s = 3\nrenew_s = 2\n",
            "renew_s (2.0) must be at most half of lease_ttl_s (3.0)",
        ),
    ],
)
def test_errors_name_file_field_and_value(tmp_path, text, expected):
    path = write(tmp_path, text)
    with pytest.raises(ConfigError) as err:
        load(path)
    assert str(err.value).startswith(f"{path}: ") and expected in str(err.value)


def test_cross_field_rules_run_after_field_checks(tmp_path):
    # a bad field and a cross-field violation: the field error is reported, not a confusing derived one
    with pytest.raises(ConfigError) as err:
        load(write(tmp_path, "[loop]\nbackoff_initial_s = -1\nbackoff_max_s = -2\n"))
    assert "greater than 0" in str(err.value) and "is below" not in str(err.value)


def test_missing_file(tmp_path):
    with pytest.raises(ConfigError, match="cannot read"):
        load(tmp_path / "absent.toml")


def test_secret_file(tmp_path):
    secret = tmp_path / "secret"
    secret.write_text("  abcdefghijklmnop\n")
    secret.chmod(0o600)
    assert read_secret(secret) == b"abcdefghijklmnop"
    secret.chmod(0o644)
    with pytest.raises(ConfigError, match="group/world accessible"):
        read_secret(secret)
    secret.write_text("\n")
    secret.chmod(0o600)
    with pytest.raises(ConfigError, match="empty"):
        read_secret(secret)


def _leaves(model: BaseModel, prefix: str = "") -> list[str]:
    out = []
    for name in type(model).model_fields:
        value = getattr(model, name)
        if isinstance(value, BaseModel):
            out += _leaves(value, f"{prefix}{name}.")
        else:
            out.append(prefix + name)
    return out


def test_example_documents_every_option_and_loads():
    text = EXAMPLE.read_text()
    assert load(EXAMPLE) == Config()
    data = tomllib.loads(text)
    for leaf in _leaves(Config()):
        *tables, key = leaf.split(".")
        section = f"[{'.'.join(tables)}]"
        assert section in text, f"{section} missing from the example"
        body = text.split(section, 1)[1].split("\n[", 1)[0]
        assert f"\n{key} = " in body or f"\n# {key} = " in body, f"{leaf} is not documented in the example"
    assert data["sense"]["url_template"] == "http://{node}:9400/metrics"


def test_example_is_current():
    """Regenerate with: fleetyield example-config > contrib/fleetyield.example.toml"""
    assert EXAMPLE.read_text() == example_toml()


def test_every_field_is_described():
    def walk(model: type[BaseModel], path: str) -> None:
        for name, info in model.model_fields.items():
            assert info.description, f"{path}{name} has no description"
            ann = info.annotation
            if isinstance(ann, type) and issubclass(ann, BaseModel) and not path.startswith("core"):
                walk(ann, f"{path}{name}.")

    walk(config.Config, "")


# --- issue #27 item 7: strict types, finite numbers, sane bounds, one secret rule, unreadable bytes ------


@pytest.mark.parametrize(
    ("text", "field", "value"),
    [
        ('[core.quarantine]\ndrain_cap_fraction = "0.5"\n', "core.quarantine.drain_cap_fraction", "'0.5'"),
        ("[core.quarantine]\ndrain_cap_fraction = true\n", "core.quarantine.drain_cap_fraction", "True"),
        ('[slurm]\ndry_run = "yes"\n', "slurm.dry_run", "'yes'"),
        ("[slurm]\ndry_run = 1\n", "slurm.dry_run", "1"),
        ('[push]\nport = "9402"\n', "push.port", "'9402'"),
        ("[push]\nport = 9402.0\n", "push.port", "9402.0"),
        ("[push]\nmax_skew_s = inf\n", "push.max_skew_s", "inf"),
        ("[push]\nmax_skew_s = nan\n", "push.max_skew_s", "nan"),
        ("[push]\nmax_skew_s = 86400\n", "push.max_skew_s", "86400"),
        (
            "[core.quarantine]\ndrain_cap_min_nodes = 1000000\n",
            "core.quarantine.drain_cap_min_nodes",
            "1000000",
        ),
        ("[loop]\nbackoff_factor = inf\n", "loop.backoff_factor", "inf"),
        ("[loop]\nbackoff_factor = 1e300\n", "loop.backoff_factor", "1e+300"),
        ("[loop]\nbackoff_max_s = inf\n", "loop.backoff_max_s", "inf"),
        ("[core.risk]\nred_threshold = 1.5\n", "core.risk.red_threshold", "1.5"),
        ('[core.risk]\ntrend_windows_s = ["60"]\n', "core.risk.trend_windows_s", "'60'"),
        ("[core.lifecycle]\ncanary_timeout_s = inf\n", "core.lifecycle.canary_timeout_s", "inf"),
        ("[redfish]\nretries = 2.5\n", "redfish.retries", "2.5"),
        ('[core.premium]\nenabled = "true"\n', "core.premium.enabled", "'true'"),
    ],
)
def test_lax_values_are_refused(tmp_path, text, field, value):
    if "trend_windows_s" in text:  # the trend windows live in [core.sense]
        text = text.replace("[core.risk]", "[core.sense]")
        field = "core.sense.trend_windows_s.0"
    path = write(tmp_path, text)
    with pytest.raises(ConfigError) as err:
        load(path)
    message = str(err.value)
    assert message.startswith(f"{path}: ") and f"{field}: " in message and f"(got {value})" in message


def test_strict_types_keep_what_toml_means(tmp_path):
    # an integer where a float is expected is a number, not a lax coercion; lists load into tuples
    cfg = load(
        write(
            tmp_path,
            "[loop]\ninterval_s = 10\n[core.quarantine]\ndrain_cap_fraction = 1\nquarantine_xids = [48, 79]\n"
            "risk_only_xids = [13]\n",
        )
    )
    assert cfg.loop.interval_s == 10.0 and cfg.core.quarantine.drain_cap_fraction == 1.0
    assert cfg.core.quarantine.quarantine_xids == (48, 79)


def test_non_utf8_file_names_the_file(tmp_path):
    path = tmp_path / "fy.toml"
    path.write_bytes(b'[slurm]\nbin_dir = "/opt/\xff\xfe"\n')
    with pytest.raises(ConfigError) as err:
        load(path)
    assert str(err.value).startswith(f"{path}: ") and "UTF-8" in str(err.value)


def test_secret_shorter_than_the_agents_minimum_is_refused(tmp_path):
    # the agent refuses a push secret under 16 bytes; the controller must refuse the same secret
    secret = tmp_path / "secret"
    secret.write_bytes(b"0123456789abcde\n")  # 15 bytes
    secret.chmod(0o600)
    with pytest.raises(ConfigError) as err:
        read_secret(secret)
    assert str(err.value).startswith(f"{secret}: push.secret_file: ") and "16 bytes" in str(err.value)
    secret.write_bytes(b"0123456789abcdef\n")
    assert read_secret(secret) == b"0123456789abcdef"


def test_store_target_is_the_url_when_set_else_the_sqlite_path(tmp_path):
    assert load(write(tmp_path, '[store]\npath = "/x/fy.db"\n')).store.target == "/x/fy.db"
    cfg = load(write(tmp_path, '[store]\nurl = "postgresql://fy@db/fy"\n'))
    assert cfg.store.target == "postgresql://fy@db/fy"
