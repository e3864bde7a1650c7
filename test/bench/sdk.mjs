// SDK latency benchmark, run by `cube bench` (internal/bench/sdk.go).
//
//   node sdk.mjs --template base --n-serial 50 --n-concurrent 100 --concurrency 50
//
// With E2B_API_URL, E2B_SANDBOX_URL and E2B_API_KEY set, it times with the
// official e2b SDK: Sandbox.create() (create), the first
// commands.run('true') (firstCmd), their sum (total) and sbx.kill() (kill),
// one at a time and in bursts of --concurrency. It prints one JSON object on
// stdout: {"serial": Run, "concurrent": Run}, Run = {create: [ms], firstCmd:
// [ms], total: [ms], kill: [ms], errors: [string]}; latency statistics are
// computed by the Go side.
import { Sandbox } from 'e2b'
import { parseArgs } from 'node:util'

const { values: opt } = parseArgs({
  options: {
    template: { type: 'string', default: 'base' },
    'n-serial': { type: 'string', default: '50' },
    'n-concurrent': { type: 'string', default: '100' },
    concurrency: { type: 'string', default: '50' },
  },
})

function newRun() {
  return { create: [], firstCmd: [], total: [], kill: [], errors: [] }
}

// one creates a sandbox, runs `true` in it and kills it, recording times in run.
async function one(run) {
  const t0 = performance.now()
  let sbx
  try {
    sbx = await Sandbox.create(opt.template, { timeoutMs: 600_000 })
    const t1 = performance.now()
    const r = await sbx.commands.run('true')
    const t2 = performance.now()
    if (r.exitCode !== 0) throw new Error(`true exited ${r.exitCode}`)
    run.create.push(t1 - t0)
    run.firstCmd.push(t2 - t1)
    run.total.push(t2 - t0)
  } catch (e) {
    run.errors.push(String(e?.message ?? e))
  }
  return sbx
}

async function kill(run, sbx) {
  if (!sbx) return
  const t = performance.now()
  try {
    await sbx.kill()
    run.kill.push(performance.now() - t)
  } catch (e) {
    run.errors.push('kill: ' + String(e?.message ?? e))
  }
}

const serial = newRun()
for (let i = 0; i < Number(opt['n-serial']); i++) {
  await kill(serial, await one(serial))
}

const concurrent = newRun()
const n = Number(opt['n-concurrent'])
const c = Math.max(1, Number(opt.concurrency))
for (let done = 0; done < n; done += c) {
  const k = Math.min(c, n - done)
  const boxes = await Promise.all(Array.from({ length: k }, () => one(concurrent)))
  await Promise.all(boxes.map((b) => kill(concurrent, b)))
}

process.stdout.write(JSON.stringify({ serial, concurrent }) + '\n')
