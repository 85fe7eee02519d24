# The relay (and the demo services) as an image: `docker build -t outbox-relay .`
FROM python:3.11-slim
WORKDIR /app
COPY pyproject.toml README.md constraints.txt ./
COPY outbox ./outbox
COPY relay ./relay
# The relay (pika, the OpenTelemetry SDK and exporters, ...); python:3.11-slim has no libpq:
# psycopg's binary build brings its own; PyMySQL for MySQL URLs; the console's web stack
# (`outbox-relay console`); the versions the tests ran with (constraints.txt).
RUN pip install --no-cache-dir -c constraints.txt '.[relay,binary,mysql,console]' && useradd --system --uid 10001 relay
USER relay
# /healthz, /readyz and /metrics when run with --http-port 9464
EXPOSE 9464
ENTRYPOINT ["outbox-relay"]
CMD ["run", "--http-port", "9464"]
