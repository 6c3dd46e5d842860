"""Settings of the pin_profile project, read from the environment through core.config
(django-environ): a bad value is a ConfigError naming the variable (manage.py: exit 2).

Only what Django itself needs lives here. The worker's own settings (REMINDER_*) and the
relay's (OUTBOX_*) are read by `reminders.config` and `outbox.config`, so that a bad value
fails the command with a clear message instead of at import time. Development and demo
tools are not installed here: pin_profile/settings_dev.py adds them.
"""

import re
from pathlib import Path

from core.config import ConfigError, Environment, choice_parser, parse_flag, parse_non_negative_int
from core.database_url import check_tls, merged_options, parse_database_url

BASE_DIR = Path(__file__).resolve().parent.parent

env = Environment()

# The development key, published on purpose: pin_profile/wsgi.py refuses it when DEBUG is off.
DEV_SECRET_KEY = "dev-only-insecure-key-change-me"  # noqa: S105
SECRET_KEY = env.str("DJANGO_SECRET_KEY", default=DEV_SECRET_KEY)
DEBUG = env.parsed("DJANGO_DEBUG", parse_flag, False)
ALLOWED_HOSTS = env.list("DJANGO_ALLOWED_HOSTS", default=["localhost", "127.0.0.1"])

INSTALLED_APPS = [
    "django.contrib.admin",
    "django.contrib.auth",
    "django.contrib.contenttypes",
    "django.contrib.sessions",
    "django.contrib.messages",
    "django.contrib.staticfiles",
    "core",
    "reminders",
    "outbox",
    # Counts the admin's requests; gunicorn's worker serves them on METRICS_ADDR
    # (pin_profile/gunicorn_conf.py), never on the admin's public port.
    "django_prometheus",
    "audit",
]

MIDDLEWARE = [
    "django_prometheus.middleware.PrometheusBeforeMiddleware",
    "django.middleware.security.SecurityMiddleware",
    # WhiteNoise serves the collected static files (collectstatic, in the image) itself.
    "whitenoise.middleware.WhiteNoiseMiddleware",
    "django.contrib.sessions.middleware.SessionMiddleware",
    "django.middleware.common.CommonMiddleware",
    "django.middleware.csrf.CsrfViewMiddleware",
    "django.contrib.auth.middleware.AuthenticationMiddleware",
    "django.contrib.messages.middleware.MessageMiddleware",
    "django.middleware.clickjacking.XFrameOptionsMiddleware",
    "django_prometheus.middleware.PrometheusAfterMiddleware",
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

# Every table lives in the PostgreSQL schema `profile`, reached through search_path; pg_catalog
# after it, and no `public`, whose objects another role may have planted (docs/operations.md,
# "Security").
DB_SCHEMA = "profile"
DB_SEARCH_PATH = f"{DB_SCHEMA},pg_catalog"
# Not a setting (lower case): neither Django's debug pages nor diffsettings show the URL.
_database_url = env.str("DATABASE_URL", default="postgres://postgres@127.0.0.1:5432/pin_profile")
# A malformed URL is a configuration error naming DATABASE_URL (exit 2 in manage.py), never
# quoting it; TLS is required to a remote server (core.database_url).
_db = parse_database_url(_database_url)
# Timeouts so that no failure hangs forever (values in milliseconds, PostgreSQL's unit).
_timeouts = {
    "statement_timeout": env.parsed("DB_STATEMENT_TIMEOUT_MS", parse_non_negative_int, 300_000),
    "lock_timeout": env.parsed("DB_LOCK_TIMEOUT_MS", parse_non_negative_int, 60_000),
    "idle_in_transaction_session_timeout": env.parsed(
        "DB_IDLE_IN_TRANSACTION_TIMEOUT_MS", parse_non_negative_int, 120_000),
}
# The URL's own libpq options (sslmode, sslrootcert, ...) are kept: merged over ours.
_db["OPTIONS"] = merged_options(_db.get("OPTIONS", {}), {
    "options": f"-c search_path={DB_SEARCH_PATH} "
    + " ".join(f"-c {name}={value}" for name, value in _timeouts.items()),
    "connect_timeout": env.parsed("DB_CONNECT_TIMEOUT_S", parse_non_negative_int, 10),
    "application_name": env.str("DB_APPLICATION_NAME", default="pin-profile-reminders"),
})
check_tls(_db, env.ENVIRON)
_db["CONN_HEALTH_CHECKS"] = True
# Behind a pooler by transaction (docs/operations.md, "Connection poolers"): nothing may outlive
# a transaction, so no server-side cursor (the admin's lists, the worker's due owners by pages)
# and no prepared statement (PgBouncer 1.18 cannot follow them from one server to the next).
DATABASE_POOL_MODE = env.parsed("DATABASE_POOL_MODE", choice_parser("session", "transaction"),
                                "session")
if DATABASE_POOL_MODE == "transaction":
    _db["DISABLE_SERVER_SIDE_CURSORS"] = True
    _db["OPTIONS"]["prepare_threshold"] = None
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
STATIC_ROOT = Path(env.str("DJANGO_STATIC_ROOT", default=str(BASE_DIR / "artifacts" / "static")))
STORAGES = {
    "default": {"BACKEND": "django.core.files.storage.FileSystemStorage"},
    "staticfiles": {"BACKEND": "whitenoise.storage.CompressedStaticFilesStorage"},
}

# Index names are the design's (docs/design.md §2.2), longer than Django's 30-character habit;
# PostgreSQL allows 63.
SILENCED_SYSTEM_CHECKS = ["models.E034"]

LOG_FORMAT = env.parsed("LOG_FORMAT", choice_parser("auto", "json", "text"), "auto")
LOG_LEVEL = env.parsed(
    "LOG_LEVEL", choice_parser("DEBUG", "INFO", "WARNING", "ERROR", "CRITICAL", upper=True), "INFO")
# One handler: records go through a queue to a thread that formats and writes them (core.logs).
LOGGING = {
    "version": 1,
    "disable_existing_loggers": False,
    "handlers": {
        "stderr": {"()": "core.logs.QueuedStderrHandler", "fmt": LOG_FORMAT},
    },
    "loggers": {
        app: {"handlers": ["stderr"], "level": LOG_LEVEL, "propagate": False}
        for app in ("core", "reminders", "outbox", "audit", "devtools")
    },
    "root": {"handlers": ["stderr"], "level": "WARNING"},
}


HSTS_SECONDS = 365 * 24 * 3600
# An admin session lasts an hour from its login (Django's default is two weeks), and ends
# with the browser.
SESSION_COOKIE_AGE = env.parsed("DJANGO_SESSION_COOKIE_AGE", parse_non_negative_int, 3600)
SESSION_EXPIRE_AT_BROWSER_CLOSE = True


def https_settings(secure: bool) -> tuple[bool, int, bool, bool, bool]:
    """SECURE_SSL_REDIRECT, SECURE_HSTS_SECONDS, SECURE_HSTS_INCLUDE_SUBDOMAINS,
    SECURE_HSTS_PRELOAD and the cookies' secure flag, each from its variable; where unset,
    all on when `secure` (HSTS for a year), all off otherwise."""
    return (
        env.parsed("DJANGO_SECURE_SSL_REDIRECT", parse_flag, secure),
        env.parsed("DJANGO_SECURE_HSTS_SECONDS", parse_non_negative_int,
                   HSTS_SECONDS if secure else 0),
        env.parsed("DJANGO_SECURE_HSTS_INCLUDE_SUBDOMAINS", parse_flag, secure),
        env.parsed("DJANGO_SECURE_HSTS_PRELOAD", parse_flag, secure),
        env.parsed("DJANGO_SECURE_COOKIES", parse_flag, secure),
    )


# Secure by default, as cookiecutter-django's production settings: the admin is served over
# HTTPS behind a TLS proxy; a plain-HTTP setup turns each off (docs/configuration.md).
(SECURE_SSL_REDIRECT, SECURE_HSTS_SECONDS, SECURE_HSTS_INCLUDE_SUBDOMAINS, SECURE_HSTS_PRELOAD,
 SESSION_COOKIE_SECURE) = https_settings(secure=not DEBUG)
CSRF_COOKIE_SECURE = SESSION_COOKIE_SECURE
CSRF_TRUSTED_ORIGINS = env.list("DJANGO_CSRF_TRUSTED_ORIGINS", default=[])
for _origin in CSRF_TRUSTED_ORIGINS:
    if not re.fullmatch(r"https?://[^/\s?#]+", _origin):
        raise ConfigError("DJANGO_CSRF_TRUSTED_ORIGINS",
                          f"expected origins like https://admin.example.com, got {_origin!r}")
