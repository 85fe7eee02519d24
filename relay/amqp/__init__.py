"""relay/amqp."""
