# Driftline service image: the same package the README installs, served on 0.0.0.0:8000.
FROM python:3.11-slim

WORKDIR /app
COPY pyproject.toml README.md ./
COPY service ./service
COPY drift ./drift
COPY retrain ./retrain
COPY configurator ./configurator
COPY functions ./functions
COPY datasets ./datasets
RUN pip install --no-cache-dir -e .

ENV DRIFTLINE_HOST=0.0.0.0 \
    DRIFTLINE_DATA_DIR=/data
VOLUME ["/data"]
EXPOSE 8000
CMD ["driftline", "serve"]
