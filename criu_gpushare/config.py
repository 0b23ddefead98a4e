"""Settings: where the chunk store and the node cache live, and how they behave.

Each setting comes from the first of these that gives it (the CRIU hook gets no arguments, so the
environment and the config file matter):
  1. a command-line flag
  2. an environment variable: CRIU_GPUSHARE_STORE, CRIU_GPUSHARE_CACHE (empty: no cache),
     CRIU_GPUSHARE_CACHE_LIMIT, CRIU_GPUSHARE_GC_GRACE, CRIU_GPUSHARE_VERIFY
  3. the config file: $CRIU_GPUSHARE_CONFIG (must exist when set), else
     /etc/criu-gpushare/config.toml (optional)
  4. the embedded default: store /var/lib/criu-gpushare/store, no cache, gc grace 1h, verify on;
     for a restore, the store its dump recorded in the image before this default
A job's own settings (the drain timeout, flag only; the GPU map, flag or CRIU_GPUSHARE_GPU_MAP) are
added by engine/settings.py's load_settings, which every command that runs a job and the hook use.

The store is a directory or s3://BUCKET/PREFIX (an S3-compatible server; its endpoint and
credentials come from the standard AWS environment variables and files, never from here).

verify: every chunk a restore or resume reads is re-hashed (XXH3-128) and checked against its name
before its bytes go to the GPU; a mismatch fails the restore naming the chunk and its file. It is
on by default. `verify = false` in the config file or CRIU_GPUSHARE_VERIFY=0 turns the hashing off
(sizes are still checked): only for a store you trust not to rot, when hashing limits restore speed.
The command that loads decides (a resume's setting, not its suspend's). Dumps (chunk names are
hashes) and node cache fills (a cache holds only chunks that matched) always hash.

Config file (TOML; every key optional):

    [store]
    path = "/var/lib/criu-gpushare/store"   # or "s3://bucket/prefix"
    gc_grace = "1h"          # seconds, or a number with s, m, h or d
    verify = true            # re-hash every chunk a restore reads (default; false skips it)

    [cache]
    path = "/var/cache/criu-gpushare"
    limit = "200G"           # bytes, or a number with K, M, G or T (powers of 1024)
"""
import os
import re
from dataclasses import dataclass, field

from .errors import ConfigError

DEFAULT_STORE = "/var/lib/criu-gpushare/store"
DEFAULT_CONFIG = "/etc/criu-gpushare/config.toml"
DEFAULT_GC_GRACE_S = 3600.0
DEFAULT_TIMEOUT_S = 60.0

ENV_STORE = "CRIU_GPUSHARE_STORE"
ENV_CACHE = "CRIU_GPUSHARE_CACHE"
ENV_CACHE_LIMIT = "CRIU_GPUSHARE_CACHE_LIMIT"
ENV_GC_GRACE = "CRIU_GPUSHARE_GC_GRACE"
ENV_VERIFY = "CRIU_GPUSHARE_VERIFY"
ENV_CONFIG = "CRIU_GPUSHARE_CONFIG"
ENV_GPU_MAP = "CRIU_GPUSHARE_GPU_MAP"

# (setting, table, key, environment variable, parser name)
_KEYS = [
    ("store", "store", "path", ENV_STORE, "location"),
    ("gc_grace_s", "store", "gc_grace", ENV_GC_GRACE, "duration"),
    ("verify", "store", "verify", ENV_VERIFY, "bool"),
    ("cache", "cache", "path", ENV_CACHE, "path"),
    ("cache_limit", "cache", "limit", ENV_CACHE_LIMIT, "size"),
]
_DEFAULTS = {"store": DEFAULT_STORE, "gc_grace_s": DEFAULT_GC_GRACE_S, "verify": True,
             "cache": None, "cache_limit": None}


@dataclass(frozen=True)
class Settings:
    store: str
    cache: object            # str, or None for no node cache
    cache_limit: object      # bytes, or None for no limit
    gc_grace_s: float
    verify: bool
    origin: dict = field(default_factory=dict)  # setting -> "flag" | "env NAME" | file | "default"
    # A job's own (engine/settings.py resolves them, by the same order): flag only, and flag or
    # CRIU_GPUSHARE_GPU_MAP (the hook's --gpu-map).
    timeout_s: float = DEFAULT_TIMEOUT_S
    gpu_map: dict = field(default_factory=dict)


def load_settings(flags=None, environ=None):
    """Resolve every setting. `flags` maps setting names to command-line values (None = unset)."""
    flags = {k: v for k, v in (flags or {}).items() if v is not None}
    environ = os.environ if environ is None else environ
    config_path, file_values = _read_config_file(environ)
    values, origin = {}, {}
    for setting, table, key, env, kind in _KEYS:
        if setting in flags:
            where, raw = "flag", flags[setting]
        elif env in environ:
            where, raw = f"env {env}", environ[env]
        elif (table, key) in file_values:
            where, raw = f"{config_path} [{table}] {key}", file_values[(table, key)]
        else:
            values[setting], origin[setting] = _DEFAULTS[setting], "default"
            continue
        values[setting] = _PARSERS[kind](raw, where)
        origin[setting] = where
    return Settings(origin=origin, **values)


def state_dir_path(environ=None):
    """Where the tool's private state lives (engine/statedir.py checks and makes it; the driver
    lock of gpu/checkpoint_api.py lives there too): $CRIU_GPUSHARE_RUN_DIR, else
    /run/criu-gpushare as root, else $XDG_RUNTIME_DIR/criu-gpushare, else /tmp/criu-gpushare-<uid>."""
    environ = os.environ if environ is None else environ
    if environ.get("CRIU_GPUSHARE_RUN_DIR"):
        return environ["CRIU_GPUSHARE_RUN_DIR"]
    if os.geteuid() == 0:
        return "/run/criu-gpushare"
    base = environ.get("XDG_RUNTIME_DIR")
    return os.path.join(base, "criu-gpushare") if base else f"/tmp/criu-gpushare-{os.geteuid()}"


def _read_config_file(environ):
    explicit = environ.get(ENV_CONFIG)
    path = explicit or DEFAULT_CONFIG
    try:
        with open(path, "rb") as f:
            data = f.read()
    except FileNotFoundError:
        if explicit:
            raise ConfigError(f"{path}: no such file (named by {ENV_CONFIG})") from None
        return path, {}
    except OSError as e:
        raise ConfigError(f"{path}: {e.strerror}") from e
    doc = parse_toml(data, path)
    known = {(t, k) for _, t, k, _, _ in _KEYS}
    values = {}
    for table, body in doc.items():
        if not isinstance(body, dict) or table not in ("store", "cache"):
            raise ConfigError(f"{path}: unknown table or key [{table}] (known: [store], [cache])")
        for key, value in body.items():
            if (table, key) not in known:
                raise ConfigError(f"{path}: unknown key {key!r} in [{table}] (known: "
                                  f"{', '.join(k for t, k in sorted(known) if t == table)})")
            values[(table, key)] = value
    return path, values


def parse_toml(data, path):
    """TOML through tomllib (Python >= 3.11), else tomli if installed, else the small subset
    parser below (tables, and string, integer, float and boolean values: all this file uses)."""
    try:
        import tomllib
    except ImportError:
        try:
            import tomli as tomllib
        except ImportError:
            tomllib = None
    if tomllib is not None:
        try:
            return tomllib.loads(data.decode())
        except (UnicodeDecodeError, tomllib.TOMLDecodeError) as e:
            raise ConfigError(f"{path}: not valid TOML: {e}") from e
    return _parse_toml_subset(data, path)


_LINE = re.compile(r"""\s*(?:\[\s*([A-Za-z0-9_-]+)\s*\]|([A-Za-z0-9_-]+)\s*=\s*(
    "(?:[^"\\]|\\.)*" | '[^']*' | true | false | [-+]?[0-9_]+(?:\.[0-9_]+)?(?:[eE][-+]?[0-9]+)?
    ))?\s*(?:\#.*)?\Z""", re.VERBOSE)


def _parse_toml_subset(data, path):
    doc = {}
    table = doc  # keys before the first [table] belong to the root
    try:
        text = data.decode()
    except UnicodeDecodeError as e:
        raise ConfigError(f"{path}: not valid TOML: {e}") from e
    for lineno, line in enumerate(text.splitlines(), 1):
        m = _LINE.match(line)
        if not m:
            raise ConfigError(f"{path}:{lineno}: not valid TOML (or beyond the subset this "
                              f"Python reads; install tomli): {line.strip()!r}")
        if m.group(1):
            table = doc.setdefault(m.group(1), {})
        elif m.group(2):
            raw = m.group(3)
            if raw[0] == '"':
                value = re.sub(r'\\(.)', lambda c: {"n": "\n", "t": "\t"}.get(c.group(1),
                                                                             c.group(1)), raw[1:-1])
            elif raw[0] == "'":
                value = raw[1:-1]
            elif raw in ("true", "false"):
                value = raw == "true"
            elif re.fullmatch(r"[-+]?[0-9_]+", raw):
                value = int(raw.replace("_", ""))
            else:
                value = float(raw.replace("_", ""))
            table[m.group(2)] = value
    return doc


def _parse_location(raw, where):
    """The store: a directory, or s3://BUCKET/PREFIX (kept as written; its bucket name is checked
    when the store is opened)."""
    if isinstance(raw, str) and raw.startswith("s3://"):
        return raw.rstrip("/")
    if raw == "":
        raise ConfigError(f"{where}: the store cannot be empty")
    return _parse_path(raw, where)


def _parse_path(raw, where):
    if not isinstance(raw, str):
        raise ConfigError(f"{where}: expected a path, got {raw!r}")
    if raw == "":
        return None  # an empty value turns an optional path (the cache) off
    return os.path.abspath(os.path.expanduser(raw))


_SIZE = re.compile(r"\s*([0-9]+(?:\.[0-9]+)?)\s*([KMGT]?)(?:i?B)?\s*\Z", re.IGNORECASE)


def parse_size(raw, where="size"):
    """Bytes from 123, "123", "64M", "200G", "1.5TiB" (powers of 1024)."""
    if isinstance(raw, bool):
        raise ConfigError(f"{where}: expected a size such as 200G, got {raw!r}")
    if isinstance(raw, int):
        value = raw
    else:
        m = _SIZE.match(str(raw))
        if not m:
            raise ConfigError(f"{where}: expected a size such as 200G, got {raw!r}")
        value = int(float(m.group(1)) * 1024 ** " KMGT".index(m.group(2).upper() or " "))
    if value < 0:
        raise ConfigError(f"{where}: size must not be negative, got {raw!r}")
    return value


_DURATION = re.compile(r"\s*([0-9]+(?:\.[0-9]+)?)\s*([smhd]?)\s*\Z")


def parse_duration(raw, where="duration"):
    """Seconds from 90, "90", "90s", "30m", "1h", "2d"."""
    if isinstance(raw, bool):
        raise ConfigError(f"{where}: expected a duration such as 1h, got {raw!r}")
    if isinstance(raw, (int, float)):
        value = float(raw)
    else:
        m = _DURATION.match(str(raw))
        if not m:
            raise ConfigError(f"{where}: expected a duration such as 30m or 1h, got {raw!r}")
        value = float(m.group(1)) * {"": 1, "s": 1, "m": 60, "h": 3600, "d": 86400}[m.group(2)]
    if value < 0:
        raise ConfigError(f"{where}: duration must not be negative, got {raw!r}")
    return value


ON_WORDS = ("1", "true", "yes", "on")
OFF_WORDS = ("0", "false", "no", "off")


def _parse_bool(raw, where):
    if isinstance(raw, bool):
        return raw
    text = str(raw).strip().lower()
    if text in ON_WORDS:
        return True
    if text in OFF_WORDS + ("",):
        return False
    raise ConfigError(f"{where}: expected true or false, got {raw!r}")


def env_switch(name, environ=None):
    """An environment variable that switches a behaviour on or off: True where it says
    1/true/yes/on, False where 0/false/no/off, None where it is unset or says anything else (the
    behaviour's default then holds)."""
    text = (os.environ if environ is None else environ).get(name, "").strip().lower()
    return True if text in ON_WORDS else False if text in OFF_WORDS else None


_PARSERS = {"path": _parse_path, "location": _parse_location, "size": parse_size, "duration": parse_duration,
            "bool": _parse_bool}
