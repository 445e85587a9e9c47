# The Allmende image: CLI, meter worker, ledger writer and API (ClickHouse server mode).
FROM python:3.11-slim
WORKDIR /app
ENV PYTHONDONTWRITEBYTECODE=1 PYTHONUNBUFFERED=1
COPY pyproject.toml README.md LICENSE ./
COPY allmende ./allmende
COPY domain ./domain
COPY schemas ./schemas
COPY streams ./streams
COPY services ./services
RUN pip install --no-cache-dir .
USER nobody
ENTRYPOINT ["allmende"]
