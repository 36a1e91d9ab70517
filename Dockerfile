# One image for every role; the command picks it (see docker-compose.yml).
FROM python:3.11-slim

ENV PYTHONDONTWRITEBYTECODE=1 PYTHONUNBUFFERED=1 PIP_NO_CACHE_DIR=1
WORKDIR /app

# torch first and pinned, so that the dependency resolution below reuses it.
# The default wheel carries CUDA for GPU workers; pass a CPU wheel spec for CPU-only images.
ARG TORCH_SPEC="torch==2.13.0"
RUN pip install "${TORCH_SPEC}"

COPY pyproject.toml README.md ./
COPY flipgate ./flipgate
COPY service ./service
COPY migrations ./migrations
COPY worker ./worker
COPY alembic.ini ./
RUN pip install .

RUN useradd --create-home flipgate && mkdir -p /data /cache && chown flipgate /data /cache
USER flipgate
ENV FLIPGATE_DATA_DIR=/data
ENTRYPOINT ["flipgate"]
CMD ["--help"]
