"""The admin's login throttle: after MAX_FAILURES failed logins for one user name within
WINDOW, that name may not log in (with any password) until the window has passed since its
last failure. Kept in the process (the admin runs one gunicorn worker a pod: docs/admin.md);
a successful login clears the name's failures.
"""

import threading
import time
from collections import OrderedDict
from collections.abc import Callable
from datetime import timedelta
from typing import Any

from django.contrib.admin.forms import AdminAuthenticationForm
from django.core.exceptions import ValidationError

MAX_FAILURES = 5
WINDOW = timedelta(minutes=15)
# Names remembered at once: past it the longest quiet is forgotten (the process stays small).
MAX_NAMES = 10_000


class LoginThrottle:
    """Failed logins per user name within a window, on an injected clock (seconds)."""

    def __init__(self, max_failures: int = MAX_FAILURES, window: timedelta = WINDOW,
                 clock: Callable[[], float] = time.monotonic) -> None:
        self.max_failures, self.window_s, self.clock = max_failures, window.total_seconds(), clock
        self._failures: OrderedDict[str, list[float]] = OrderedDict()
        self._lock = threading.Lock()

    def _recent(self, name: str, now: float) -> list[float]:
        recent = [at for at in self._failures.get(name, []) if now - at < self.window_s]
        if recent:
            self._failures[name] = recent
        else:
            self._failures.pop(name, None)
        return recent

    def blocked_for(self, name: str) -> float:
        """Seconds until `name` may try again (0: it may now)."""
        with self._lock:
            now = self.clock()
            recent = self._recent(name.lower(), now)
            if len(recent) < self.max_failures:
                return 0.0
            return max(0.0, recent[-1] + self.window_s - now)

    def failed(self, name: str) -> None:
        with self._lock:
            key = name.lower()
            self._failures.setdefault(key, []).append(self.clock())
            self._failures.move_to_end(key)
            del self._failures[key][:-self.max_failures]
            while len(self._failures) > MAX_NAMES:
                self._failures.popitem(last=False)

    def succeeded(self, name: str) -> None:
        with self._lock:
            self._failures.pop(name.lower(), None)


LOGIN_THROTTLE = LoginThrottle()


class ThrottledLoginForm(AdminAuthenticationForm):
    """The admin's login form, refusing a throttled name before checking its password."""

    def clean(self) -> dict[str, Any]:
        name = str(self.data.get("username", ""))
        wait = LOGIN_THROTTLE.blocked_for(name)
        if wait:
            raise ValidationError(
                f"Too many failed logins for this user: try again in {int(wait // 60) + 1} "
                "minute(s).", code="throttled")
        try:
            cleaned: dict[str, Any] = super().clean()
        except ValidationError:
            LOGIN_THROTTLE.failed(name)
            raise
        LOGIN_THROTTLE.succeeded(name)
        return cleaned
