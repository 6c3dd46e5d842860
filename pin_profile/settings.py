"""Settings of the pin_profile project, read from the environment (django-environ).

Only what Django itself needs lives here. The worker's own settings
(REMINDER_*) are parsed and validated by `reminders.config`, so that a bad
value fails the command with a clear message instead of at import time.
"""

import re
import warnings
from pathlib import Path

import environ
from django.core.exceptions import ImproperlyConfigured

BASE_DIR = Path(__file__).resolve().parent.parent

env = environ.Env()

SECRET_KEY = env.str("DJANGO_SECRET_KEY", default="dev-only-insecure-key-change-me")
DEBUG = env.bool("DJANGO_DEBUG", default=False)
ALLOWED_HOSTS = env.list("DJANGO_ALLOWED_HOSTS", default=["localhost", "127.0.0.1"])

INSTALLED_APPS = [
    "django.contrib.admin",
    "django.contrib.auth",
    "django.contrib.contenttypes",
    "django.contrib.sessions",
    "django.contrib.messages",
    "django.contrib.staticfiles",
    "reminders",
    "outbox",
]

MIDDLEWARE = [
    "django.middleware.security.SecurityMiddleware",
    "django.contrib.sessions.middleware.SessionMiddleware",
    "django.middleware.common.CommonMiddleware",
    "django.middleware.csrf.CsrfViewMiddleware",
    "django.contrib.auth.middleware.AuthenticationMiddleware",
    "django.contrib.messages.middleware.MessageMiddleware",
    "django.middleware.clickjacking.XFrameOptionsMiddleware",
]

ROOT_URLCONF = "pin_profile.urls"

TEMPLATES = [
    {
        "BACKEND": "django.template.backends.django.DjangoTemplates",
        "DIRS": [],
        "APP_DIRS": True,
        "OPTIONS": {
            "context_processors": [
                "django.template.context_processors.request",
                "django.contrib.auth.context_processors.auth",
                "django.contrib.messages.context_processors.messages",
            ],
        },
    },
]

WSGI_APPLICATION = "pin_profile.wsgi.application"

# Every table lives in the PostgreSQL schema `profile`, reached through search_path.
DB_SCHEMA = "profile"
DATABASE_URL = env.str("DATABASE_URL", default="postgres://postgres@127.0.0.1:5432/pin_profile")


def _env_int(name: str, default: int) -> int:
    """A whole-number setting >= 0; a bad value is a configuration error naming it."""
    raw = env.str(name, default=str(default)).strip()
    if not raw.isascii() or not raw.isdigit():
        raise ImproperlyConfigured(f"{name}: expected a whole number >= 0, got {raw!r}")
    return int(raw)


# A malformed URL is a configuration error naming DATABASE_URL (exit 2 in manage.py).
try:
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")  # django-environ warns before we explain
        _db = env.db_url_config(DATABASE_URL)
except ValueError as exc:
    raise ImproperlyConfigured(f"DATABASE_URL: {exc}") from None
if _db.get("ENGINE") != "django.db.backends.postgresql":
    raise ImproperlyConfigured("DATABASE_URL must be a postgres:// URL")
if not _db.get("NAME"):
    raise ImproperlyConfigured("DATABASE_URL names no database (postgres://user@host:port/NAME)")
# Timeouts so that no failure hangs forever (values in milliseconds, PostgreSQL's unit).
_timeouts = {
    "statement_timeout": _env_int("DB_STATEMENT_TIMEOUT_MS", 300_000),
    "lock_timeout": _env_int("DB_LOCK_TIMEOUT_MS", 60_000),
    "idle_in_transaction_session_timeout": _env_int("DB_IDLE_IN_TRANSACTION_TIMEOUT_MS", 120_000),
}
_db["OPTIONS"] = {
    "options": f"-c search_path={DB_SCHEMA},public "
    + " ".join(f"-c {name}={value}" for name, value in _timeouts.items()),
    "connect_timeout": _env_int("DB_CONNECT_TIMEOUT_S", 10),
    "application_name": env.str("DB_APPLICATION_NAME", default="pin-profile-reminders"),
}
_db["CONN_HEALTH_CHECKS"] = True
DATABASES = {"default": _db}

DEFAULT_AUTO_FIELD = "django.db.models.BigAutoField"

AUTH_PASSWORD_VALIDATORS = [
    {"NAME": "django.contrib.auth.password_validation.UserAttributeSimilarityValidator"},
    {"NAME": "django.contrib.auth.password_validation.MinimumLengthValidator"},
    {"NAME": "django.contrib.auth.password_validation.CommonPasswordValidator"},
    {"NAME": "django.contrib.auth.password_validation.NumericPasswordValidator"},
]

LANGUAGE_CODE = "en-us"
TIME_ZONE = "UTC"
USE_I18N = True
USE_TZ = True

STATIC_URL = "static/"
STATIC_ROOT = BASE_DIR / "artifacts" / "static"

# Index names are the design's (DESIGN 2.2), longer than Django's 30-character habit;
# PostgreSQL allows 63.
SILENCED_SYSTEM_CHECKS = ["models.E034"]

LOG_FORMAT = env.str("LOG_FORMAT", default="auto")  # auto | json | text
LOG_LEVEL = env.str("LOG_LEVEL", default="INFO")
if LOG_FORMAT not in {"auto", "json", "text"}:
    raise ImproperlyConfigured(f"LOG_FORMAT: expected auto, json or text, got {LOG_FORMAT!r}")
if LOG_LEVEL.upper() not in {"DEBUG", "INFO", "WARNING", "ERROR", "CRITICAL"}:
    raise ImproperlyConfigured(
        f"LOG_LEVEL: expected DEBUG, INFO, WARNING, ERROR or CRITICAL, got {LOG_LEVEL!r}")
LOG_LEVEL = LOG_LEVEL.upper()
LOGGING = {
    "version": 1,
    "disable_existing_loggers": False,
    "formatters": {
        "structured": {"()": "reminders.logs.StructuredFormatter", "fmt": LOG_FORMAT},
    },
    "handlers": {
        "stderr": {"class": "logging.StreamHandler", "formatter": "structured"},
    },
    "loggers": {
        "reminders": {"handlers": ["stderr"], "level": LOG_LEVEL, "propagate": False},
        "outbox": {"handlers": ["stderr"], "level": LOG_LEVEL, "propagate": False},
    },
    "root": {"handlers": ["stderr"], "level": "WARNING"},
}

# Observability of the web (admin) process: django-prometheus counts requests and serves
# /metrics (pin_profile/urls.py). The worker and the relay serve theirs on METRICS_ADDR.
INSTALLED_APPS += ["django_prometheus"]
MIDDLEWARE = [
    "django_prometheus.middleware.PrometheusBeforeMiddleware",
    *MIDDLEWARE,
    "django_prometheus.middleware.PrometheusAfterMiddleware",
]

# --- The admin as a production web process (issue 13, part 3) ------------------------------
# Static files, the secret key, HTTPS and cookies of the admin under gunicorn
# (pin_profile/gunicorn_conf.py). README "Deployment" lists the variables; the worker and the
# relay sign nothing and serve no pages, so none of these matter to them.

# The default of DJANGO_SECRET_KEY above: pin_profile/wsgi.py refuses it when DEBUG is off.
DEV_SECRET_KEY = "dev-only-insecure-key-change-me"  # noqa: S105 - published on purpose

_FLAG_VALUES = {"1": True, "true": True, "yes": True, "on": True,
                "0": False, "false": False, "no": False, "off": False}


def _env_flag(name: str, default: bool = False) -> bool:
    """on/off, true/false, yes/no or 1/0; anything else is a configuration error naming it."""
    raw = env.str(name, default="on" if default else "off").strip().lower()
    if raw not in _FLAG_VALUES:
        raise ImproperlyConfigured(f"{name}: expected on or off (true/false, yes/no, 1/0), got {raw!r}")
    return _FLAG_VALUES[raw]


# WhiteNoise serves the collected files (collectstatic, in the image) from the process itself.
STATIC_ROOT = Path(env.str("DJANGO_STATIC_ROOT", default=str(STATIC_ROOT)))
STORAGES = {
    "default": {"BACKEND": "django.core.files.storage.FileSystemStorage"},
    "staticfiles": {"BACKEND": "whitenoise.storage.CompressedStaticFilesStorage"},
}
MIDDLEWARE.insert(MIDDLEWARE.index("django.middleware.security.SecurityMiddleware") + 1,
                  "whitenoise.middleware.WhiteNoiseMiddleware")

# HTTPS: set these where a TLS proxy fronts the admin (it passes X-Forwarded-Proto to gunicorn).
SECURE_SSL_REDIRECT = _env_flag("DJANGO_SECURE_SSL_REDIRECT")
SECURE_HSTS_SECONDS = _env_int("DJANGO_SECURE_HSTS_SECONDS", 0)
SECURE_HSTS_INCLUDE_SUBDOMAINS = _env_flag("DJANGO_SECURE_HSTS_INCLUDE_SUBDOMAINS")
SECURE_HSTS_PRELOAD = _env_flag("DJANGO_SECURE_HSTS_PRELOAD")
SESSION_COOKIE_SECURE = CSRF_COOKIE_SECURE = _env_flag("DJANGO_SECURE_COOKIES")
CSRF_TRUSTED_ORIGINS = env.list("DJANGO_CSRF_TRUSTED_ORIGINS", default=[])
for _origin in CSRF_TRUSTED_ORIGINS:
    if not re.fullmatch(r"https?://[^/\s?#]+", _origin):
        raise ImproperlyConfigured(
            f"DJANGO_CSRF_TRUSTED_ORIGINS: expected origins like https://admin.example.com, got {_origin!r}")
