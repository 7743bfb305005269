// A TypeScript SDK worker with a no-op handler, for bench/sdk/run.py: settles what it
// claims, stops after 3 empty polls, prints its counters.
import { Client, Worker } from "../../clients/typescript/dist/index.js";

const [url, workerId, concurrency, batch] = process.argv.slice(2);
let idle = 0;
const worker = new Worker(new Client(url), {
  workerId,
  concurrency: Number(concurrency),
  batchSize: Number(batch) || undefined,
  leaseMs: 60_000,
  waitMs: 200,
  handler: async () => undefined,
  onEvent: (event, _job, info) => {
    if (event !== "poll") return;
    idle = info.claimed ? 0 : idle + 1;
    if (idle >= 3) worker.stop();
  },
});
await worker.run();
console.log(JSON.stringify(worker.stats));
