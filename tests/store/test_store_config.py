"""Settings (criu_gpushare/config.py): flag > environment > config file > embedded default."""
import pytest

from criu_gpushare import config
from criu_gpushare.config import (DEFAULT_STORE, load_settings, parse_duration, parse_size,
                                  _parse_toml_subset)
from criu_gpushare.errors import ConfigError

CONFIG = b"""
# criu-gpushare settings
[store]
path = "/srv/store"      # shared by the nodes
gc_grace = "30m"
verify = true

[cache]
path = '/var/cache/cg'
limit = "200G"
"""


@pytest.fixture
def config_file(tmp_path):
    p = tmp_path / "config.toml"
    p.write_bytes(CONFIG)
    return p


def test_embedded_defaults_without_any_setting(monkeypatch, tmp_path):
    monkeypatch.setattr(config, "DEFAULT_CONFIG", str(tmp_path / "absent.toml"))
    s = load_settings(environ={})
    assert (s.store, s.cache, s.cache_limit, s.gc_grace_s, s.verify) == (
        DEFAULT_STORE, None, None, 3600.0, True)
    assert set(s.origin.values()) == {"default"}


@pytest.mark.parametrize("env, file_text, expected", [
    ({}, None, True),                                   # verify on read is the default
    ({"CRIU_GPUSHARE_VERIFY": "0"}, None, False),       # the explicit opt-out
    ({}, b"[store]\nverify = false\n", False),
    ({"CRIU_GPUSHARE_VERIFY": "1"}, b"[store]\nverify = false\n", True),
])
def test_verify_defaults_on_and_can_be_turned_off(monkeypatch, tmp_path, env, file_text, expected):
    monkeypatch.setattr(config, "DEFAULT_CONFIG", str(tmp_path / "absent.toml"))
    env = dict(env)
    if file_text is not None:
        (tmp_path / "c.toml").write_bytes(file_text)
        env["CRIU_GPUSHARE_CONFIG"] = str(tmp_path / "c.toml")
    assert load_settings(environ=env).verify is expected


def test_config_file_then_environment_then_flag(config_file):
    env = {"CRIU_GPUSHARE_CONFIG": str(config_file)}
    s = load_settings(environ=env)
    assert (s.store, s.cache, s.cache_limit, s.gc_grace_s, s.verify) == (
        "/srv/store", "/var/cache/cg", 200 << 30, 1800.0, True)
    assert s.origin["store"] == f"{config_file} [store] path"

    env.update(CRIU_GPUSHARE_STORE="/env/store", CRIU_GPUSHARE_CACHE="",
               CRIU_GPUSHARE_GC_GRACE="2h")
    s = load_settings(environ=env)
    assert (s.store, s.cache, s.gc_grace_s) == ("/env/store", None, 7200.0)
    assert s.origin["store"] == "env CRIU_GPUSHARE_STORE"

    s = load_settings({"store": "/flag/store", "cache_limit": "1M"}, environ=env)
    assert (s.store, s.cache_limit) == ("/flag/store", 1 << 20)
    assert s.origin["store"] == "flag"


def test_the_default_config_file_is_read_when_present(monkeypatch, config_file):
    monkeypatch.setattr(config, "DEFAULT_CONFIG", str(config_file))
    assert load_settings(environ={}).store == "/srv/store"


def test_a_named_config_file_that_is_missing_is_an_error(tmp_path):
    missing = tmp_path / "nope.toml"
    with pytest.raises(ConfigError, match=f"{missing}: no such file \\(named by "
                                          f"CRIU_GPUSHARE_CONFIG\\)"):
        load_settings(environ={"CRIU_GPUSHARE_CONFIG": str(missing)})


@pytest.mark.parametrize("text,message", [
    (b"[store]\npaht = '/x'\n", "unknown key 'paht' in \\[store\\]"),
    (b"[stor]\npath = '/x'\n", "unknown table or key \\[stor\\]"),
    (b"[store]\npath = \n", "not valid TOML"),
    (b"[cache]\nlimit = 'lots'\n", "expected a size such as 200G"),
    (b"[store]\ngc_grace = 'soon'\n", "expected a duration"),
    (b"[store]\nverify = 'maybe'\n", "expected true or false"),
])
def test_bad_config_files_name_the_file_and_the_problem(tmp_path, text, message):
    p = tmp_path / "c.toml"
    p.write_bytes(text)
    with pytest.raises(ConfigError, match=f"{p}.*{message}"):
        load_settings(environ={"CRIU_GPUSHARE_CONFIG": str(p)})


def test_the_python_3_10_fallback_parser_reads_what_tomllib_reads():
    tomllib = pytest.importorskip("tomllib", reason="tomllib is Python >= 3.11; compared there")
    assert _parse_toml_subset(CONFIG, "c.toml") == tomllib.loads(CONFIG.decode())
    extra = b'a = 1_000\nb = -2.5\nc = false\nd = "q\\"uote"\n'
    assert _parse_toml_subset(extra, "c.toml") == tomllib.loads(extra.decode())


def test_the_fallback_parser_names_the_line_it_cannot_read():
    with pytest.raises(ConfigError, match="c.toml:2: not valid TOML"):
        _parse_toml_subset(b"[store]\npath = [1, 2]\n", "c.toml")


@pytest.mark.parametrize("raw,value", [(123, 123), ("123", 123), ("64M", 64 << 20),
                                       ("200G", 200 << 30), ("1.5TiB", int(1.5 * (1 << 40))),
                                       ("10 KB", 10 << 10)])
def test_sizes(raw, value):
    assert parse_size(raw) == value


@pytest.mark.parametrize("raw,value", [(90, 90.0), ("90", 90.0), ("45s", 45.0), ("30m", 1800.0),
                                       ("1h", 3600.0), ("2d", 172800.0), ("0", 0.0)])
def test_durations(raw, value):
    assert parse_duration(raw) == value


def test_without_tomllib_or_tomli_the_subset_parser_is_used(monkeypatch, config_file):
    monkeypatch.setitem(__import__("sys").modules, "tomllib", None)  # as on Python 3.10
    monkeypatch.setitem(__import__("sys").modules, "tomli", None)
    s = load_settings(environ={"CRIU_GPUSHARE_CONFIG": str(config_file)})
    assert (s.store, s.cache_limit, s.verify) == ("/srv/store", 200 << 30, True)
