"""The pages' files, read from the package with importlib.resources: they ship inside the wheel.

ECharts is vendored under static/vendor/ (the npm package's `dist/echarts.min.js`, with the
licences of ECharts and of what its bundle contains; `make vendor-echarts` refreshes it), so the
pages need no CDN, no npm at run time and nothing outside the installed package.
"""

from __future__ import annotations

from importlib.resources import files
from importlib.resources.abc import Traversable

WEB: Traversable = files("allmende.services.web")
STATIC = WEB / "static"
TEMPLATES = WEB / "templates"
ECHARTS = STATIC / "vendor" / "echarts.min.js"
ECHARTS_VERSION = "6.1.0"  # the npm package vendored (make vendor-echarts)


def echarts_source() -> str:
    """ECharts as text, safe to inline in a <script> element."""
    source = ECHARTS.read_text(encoding="utf-8")
    # A literal `</script` would end the inline script early (ECharts has none today).
    return source.replace("</script", "<\\/script").replace("</SCRIPT", "<\\/SCRIPT")
