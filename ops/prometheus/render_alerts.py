#!/usr/bin/env python3
"""Render the alert rules with your runbook base URL.

    RUNBOOK_BASE_URL=https://git.example.com/pin/pin-profile/-/blob/v1.4/docs/runbooks \
        python3 ops/prometheus/render_alerts.py --output /etc/prometheus/rules/pin-profile.yml

alerts.yml (beside this script) ships with a placeholder base; every alert's `runbook_url`
is that base plus `/<page>.md#<alert name in lower case>`. This writes the same rules with
RUNBOOK_BASE_URL in place of the placeholder, to --output or to standard output. The base
must be an absolute http(s) URL of the folder that serves docs/runbooks/. Check the result
with `promtool check rules FILE`. Standard library only: runs with any Python 3.11.

--prometheusrule writes the same rules as a Prometheus Operator PrometheusRule (the rules as
its spec, comments kept); deploy/kubernetes/base/prometheusrule.yaml is this, with the
placeholder base (tests/ops/test_kubernetes.py fails when it is stale):

    RUNBOOK_BASE_URL=https://runbooks.example.invalid/pin-profile/docs/runbooks \
        python3 ops/prometheus/render_alerts.py --prometheusrule \
        --output deploy/kubernetes/base/prometheusrule.yaml

Exit codes: 0 written, 2 RUNBOOK_BASE_URL missing or not an absolute http(s) URL.
"""

import argparse
import os
import re
import sys
from pathlib import Path
from urllib.parse import urlsplit

RULES = Path(__file__).resolve().parent / "alerts.yml"
PLACEHOLDER_BASE = "https://runbooks.example.invalid/pin-profile/docs/runbooks"
VARIABLE = "RUNBOOK_BASE_URL"
EXIT_USAGE = 2
_RUNBOOK_URL = re.compile(r"^(\s+runbook_url: )(\S+)$", re.MULTILINE)


class BaseUrlError(ValueError):
    pass


def checked_base(raw: str) -> str:
    """The base URL without its trailing slash, or BaseUrlError saying what is wrong."""
    base = raw.strip().rstrip("/")
    if not base:
        raise BaseUrlError("not set: give the absolute http(s) URL of docs/runbooks/")
    parts = urlsplit(base)
    if parts.scheme not in ("http", "https") or not parts.netloc:
        raise BaseUrlError(f"expected an absolute http(s) URL, got {raw!r}")
    if re.search(r"[\s\"'#?{}]", base):  # it goes into YAML and in front of '#anchor'
        raise BaseUrlError(f"no spaces, quotes, '#', '?' or braces, got {raw!r}")
    return base


def render(rules: str, base: str) -> str:
    """`rules` with the placeholder base of every runbook_url replaced by `base`, under a
    first line saying so."""

    def replace(match: re.Match[str]) -> str:
        url = match[2]
        if not url.startswith(PLACEHOLDER_BASE + "/"):
            raise ValueError(f"runbook_url {url!r} does not start with {PLACEHOLDER_BASE}/")
        return match[1] + base + url[len(PLACEHOLDER_BASE):]

    header = f"# Rendered from alerts.yml by render_alerts.py with {VARIABLE}={base}\n"
    return header + _RUNBOOK_URL.sub(replace, rules)


PROMETHEUS_RULE_HEAD = """\
# Generated: do not edit. ops/prometheus/alerts.yml as a PrometheusRule, by
# `ops/prometheus/render_alerts.py --prometheusrule` with {variable}={base}.
apiVersion: monitoring.coreos.com/v1
kind: PrometheusRule
metadata:
  name: pin-profile-reminders
spec:
"""


def prometheus_rule(rules: str, base: str) -> str:
    """`rules` rendered with `base`, as the spec of a PrometheusRule: its lines indented under
    `spec:` (block scalars keep their meaning when every line moves alike)."""
    rendered = render(rules, base).split("\n", 1)[1]  # the rules' own header says which base
    body = "".join(f"  {line}" if line.strip() else line
                   for line in rendered.splitlines(keepends=True))
    return PROMETHEUS_RULE_HEAD.format(variable=VARIABLE, base=base) + body


def main(argv: list[str]) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0] if __doc__ else None)
    parser.add_argument("--output", type=Path, help="write here (default: standard output)")
    parser.add_argument("--prometheusrule", action="store_true",
                        help="a Prometheus Operator PrometheusRule instead of a rules file")
    args = parser.parse_args(argv)
    try:
        base = checked_base(os.environ.get(VARIABLE, ""))
    except BaseUrlError as exc:
        sys.stderr.write(f"{VARIABLE}: {exc}\n")
        return EXIT_USAGE
    as_text = prometheus_rule if args.prometheusrule else render
    rendered = as_text(RULES.read_text(encoding="utf-8"), base)
    if args.output:
        args.output.write_text(rendered, encoding="utf-8")
    else:
        sys.stdout.write(rendered)
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
