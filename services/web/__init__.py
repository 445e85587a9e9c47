"""The dashboards' browser pages (Jinja2 templates, plain JavaScript, ECharts), served under /ui."""
