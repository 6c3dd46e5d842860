"""DATABASE_URL as Django's database settings: parsed without ever echoing a fragment of it,
the URL's libpq options merged with the project's, and TLS required to a remote server.

The TLS policy (docs/operations.md, "Security"): a connection to a host that is not loopback
must use `sslmode=verify-full` (a certificate checked against its CA and the host's name),
unless DATABASE_SSLMODE_ALLOW names the lesser mode it uses. A Unix socket or a loopback
address never leaves the machine, so any mode is accepted there.
"""

import warnings
from collections.abc import Mapping
from typing import Any

import environ

from core.config import ConfigError, is_local_host

URL_VAR = "DATABASE_URL"
SSLMODE_ALLOW_VAR = "DATABASE_SSLMODE_ALLOW"
SSLMODES = ("disable", "allow", "prefer", "require", "verify-ca", "verify-full")
# libpq's mode when neither the URL nor PGSSLMODE names one.
LIBPQ_DEFAULT_SSLMODE = "prefer"
_SHAPE = "postgres://USER:PASSWORD@HOST:PORT/NAME"
_ENCODE = ("percent-encode a '/', '?', '#', '@' or '%' in the user or password "
           "(%2F, %3F, %23, %40, %25)")


def parse_database_url(url: str) -> dict[str, Any]:
    """Django's database dictionary for `url`; a ConfigError says what is wrong with its shape
    and never repeats any part of it (it may hold a password)."""
    try:
        with warnings.catch_warnings():
            warnings.simplefilter("ignore")  # django-environ warns before we explain
            config: dict[str, Any] = environ.Env.db_url_config(url)
    except Exception as exc:  # any parser failure gets the same fixed message
        problem = ("its port is not a number" if "port" in str(exc).lower()
                   else f"it is not a URL of the shape {_SHAPE}")
        raise ConfigError(URL_VAR, f"cannot be parsed: {problem}; {_ENCODE}") from None
    if config.get("ENGINE") != "django.db.backends.postgresql":
        raise ConfigError(URL_VAR, f"must be a postgres:// URL ({_SHAPE})")
    if not config.get("NAME"):
        raise ConfigError(URL_VAR, f"names no database ({_SHAPE})")
    port = str(config.get("PORT") or "")
    if any(not part.isascii() or not part.isdigit() or not 0 < int(part) < 65536
           for part in port.split(",") if part):
        raise ConfigError(URL_VAR, f"its port is not a number from 1 to 65535; {_ENCODE}")
    return config


def merged_options(url_options: Mapping[str, Any], ours: Mapping[str, Any]) -> dict[str, Any]:
    """The connection's libpq options: every one the URL gives (sslmode, sslrootcert, ...), over
    ours; `options` (the server settings) joined, the URL's after ours so that they win."""
    merged = {**ours, **url_options}
    if "options" in url_options and "options" in ours:
        merged["options"] = f"{ours['options']} {url_options['options']}"
    return merged


def tls_refusal(host: str, sslmode: str, allowed: str | None) -> str | None:
    """Why a connection to `host` with `sslmode` is refused (None: it is not): a remote host
    needs verify-full, or DATABASE_SSLMODE_ALLOW naming the mode."""
    if sslmode in ("verify-full", allowed):
        return None
    remote = [h for h in host.split(",") if not is_local_host(h)]
    if not remote:
        return None
    return (f"sslmode={sslmode} to a host that is not loopback ({len(remote)} of them): the "
            "server's certificate is not verified; add sslmode=verify-full (and "
            f"sslrootcert=<CA file>) to the URL, or set {SSLMODE_ALLOW_VAR}={sslmode} to accept it")


def check_tls(config: Mapping[str, Any], environ_: Mapping[str, str]) -> None:
    """ConfigError unless the connection `config` describes keeps TLS where the policy asks."""
    allowed = environ_.get(SSLMODE_ALLOW_VAR)
    if allowed is not None and allowed.strip() not in SSLMODES:
        raise ConfigError(SSLMODE_ALLOW_VAR,
                          f"expected one of {', '.join(SSLMODES)}, got {allowed.strip()!r}")
    options = config.get("OPTIONS", {})
    sslmode = str(options.get("sslmode") or environ_.get("PGSSLMODE") or LIBPQ_DEFAULT_SSLMODE)
    if sslmode not in SSLMODES:
        raise ConfigError(URL_VAR, f"sslmode: expected one of {', '.join(SSLMODES)}")
    # Where libpq connects: the host, or the address `hostaddr` names for it.
    hosts = [str(config.get("HOST") or environ_.get("PGHOST") or ""),
             *([str(options["hostaddr"])] if options.get("hostaddr") else [])]
    problem = tls_refusal(",".join(hosts), sslmode,
                          allowed.strip() if allowed is not None else None)
    if problem:
        raise ConfigError(URL_VAR, problem)
