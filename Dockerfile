# The relay (and the demo services) as an image: `docker build -t outbox-relay .`
FROM python:3.11-slim
WORKDIR /app
COPY pyproject.toml README.md ./
COPY outbox ./outbox
COPY relay ./relay
RUN pip install --no-cache-dir . && useradd --system --uid 10001 relay
USER relay
# /healthz, /readyz and /metrics when run with --http-port 9464
EXPOSE 9464
ENTRYPOINT ["outbox-relay"]
CMD ["run", "--http-port", "9464"]
