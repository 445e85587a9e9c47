# The Allmende image: CLI, meter worker, ledger writer and API (ClickHouse server mode).
# Stage 1 builds the wheel (the pages' assets are inside the package); stage 2 installs only it.
FROM python:3.11-slim AS build
WORKDIR /src
COPY . .
RUN pip install --no-cache-dir build && python -m build --wheel --outdir /dist

FROM python:3.11-slim
ENV PYTHONDONTWRITEBYTECODE=1 PYTHONUNBUFFERED=1 ALLMENDE_STATE_DIR=/var/lib/allmende
COPY --from=build /dist/*.whl /tmp/
RUN pip install --no-cache-dir /tmp/*.whl && rm /tmp/*.whl \
    && mkdir -p /var/lib/allmende && chown nobody /var/lib/allmende
WORKDIR /var/lib/allmende
USER nobody
ENTRYPOINT ["allmende"]
