const amqp = require("amqplib");
const { Webhook } = require("standardwebhooks");

const hooks = process.env.OUTBOX_SIGNING_KEYS.split(",").map((secret) => new Webhook(secret));

function verify(msg) {
  const headers = {};
  for (const [name, value] of Object.entries(msg.properties.headers || {})) {
    headers[name] = String(value);
  }
  if (headers["webhook-id"] !== msg.properties.messageId) {
    throw new Error("the signed webhook-id is not the message id");
  }
  let error;
  for (const hook of hooks) {
    try {
      return hook.verify(msg.content, headers); // the body, parsed as JSON
    } catch (err) {
      error = err;
    }
  }
  throw error;
}

async function main() {
  const connection = await amqp.connect(process.env.AMQP_URL);
  const channel = await connection.createChannel();
  await channel.consume(process.env.QUEUE, (msg) => {
    const id = msg.properties.messageId;
    try {
      verify(msg);
    } catch (err) {
      console.log(`refused ${id}: ${err.message}`);
      channel.nack(msg, false, false);
      return;
    }
    console.log(`verified ${id}`);
    channel.ack(msg);
  });
}

main();
