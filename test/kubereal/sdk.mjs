// Driver for test/kubereal: the official e2b SDK (installed under test/e2e
// by `make deps`) against the cube-server Service of the local cluster.
// The Go tests run one verb per process and read the JSON document printed
// on the last line of stdout; `probe` prints one JSON line per attempt.
//
//   node sdk.mjs create-counters N     -> ["id", ...]   sandboxes running a counter loop
//   node sdk.mjs check ID...           -> [{id, ok, before, after, error}]
//   node sdk.mjs states ID...          -> {"id": "running" | "gone" | "error: ..."}
//   node sdk.mjs create-one            -> {id, ms}      create, command, file, kill
//   node sdk.mjs try-create            -> {ok, id?, error?}  a create that may be refused
//   node sdk.mjs kill ID...            -> {"id": true|false}
//   node sdk.mjs sweep                 -> [ids killed]  every sandbox tagged by this suite
//   node sdk.mjs probe ID              -> {t, ok, counter?, error?} lines until stdin closes
//
// Needs E2B_API_URL, E2B_SANDBOX_URL, E2B_API_KEY and KUBEREAL_E2E_DIR.
import { readFileSync } from 'node:fs'
import { join } from 'node:path'
import { pathToFileURL } from 'node:url'

const e2eDir = process.env.KUBEREAL_E2E_DIR
if (!e2eDir) throw new Error('KUBEREAL_E2E_DIR is not set (the directory of test/e2e with node_modules)')
// The SDK lives in test/e2e/node_modules; ES module resolution does not look
// there from this directory, so import its module entry by path.
const pkgDir = join(e2eDir, 'node_modules', 'e2b')
const pkg = JSON.parse(readFileSync(join(pkgDir, 'package.json'), 'utf8'))
const { Sandbox, SandboxNotFoundError } = await import(pathToFileURL(join(pkgDir, pkg.module ?? pkg.main)).href)

const TAG = { suite: 'kubereal' }
const COUNTER = '/tmp/kubereal-counter'
const MARKER = '/home/user/kubereal-id'
// A loop that survives the command that started it (setsid, no open pipes)
// and writes an increasing number atomically twice a second.
const COUNTER_LOOP = `setsid sh -c 'i=0; while :; do i=$((i+1)); echo $i > ${COUNTER}.tmp && mv ${COUNTER}.tmp ${COUNTER}; sleep 0.5; done' </dev/null >/dev/null 2>&1 &`

const opts = (extra = {}) => ({ timeoutMs: 3_600_000, requestTimeoutMs: 60_000, metadata: TAG, ...extra })
const sleep = (ms) => new Promise((resolve) => setTimeout(resolve, ms))
const msg = (err) => `${err?.name ?? 'Error'}: ${err?.message ?? err}`.slice(0, 500)

async function pool (items, limit, fn) {
  const out = new Array(items.length)
  let next = 0
  await Promise.all(Array.from({ length: Math.min(limit, items.length) }, async () => {
    while (next < items.length) {
      const i = next++
      out[i] = await fn(items[i], i)
    }
  }))
  return out
}

async function readCounter (sbx) {
  const v = Number((await sbx.files.read(COUNTER, { requestTimeoutMs: 10_000 })).trim())
  if (!Number.isInteger(v) || v <= 0) throw new Error(`counter file holds ${JSON.stringify(v)}`)
  return v
}

async function createCounters (n) {
  const made = []
  try {
    await pool(Array.from({ length: n }, (_, i) => i), 3, async () => {
      const sbx = await Sandbox.create(opts())
      made.push(sbx.sandboxId)
      await sbx.files.write(MARKER, sbx.sandboxId)
      await sbx.commands.run(COUNTER_LOOP, { user: 'root' })
      for (let i = 0; i < 40; i++) { // the loop's first write
        try { await readCounter(sbx); return } catch { await sleep(250) }
      }
      throw new Error(`sandbox ${sbx.sandboxId}: counter never written`)
    })
  } catch (err) {
    await pool(made, 4, (id) => Sandbox.kill(id).catch(() => false))
    throw err
  }
  return made
}

// check proves a sandbox is the same one and still running its loop: the
// marker written at create, the counter read through the files API, then
// (after > 1 s) through a command, and a new file written and read back.
async function check (id) {
  const r = { id, ok: false }
  try {
    const sbx = await Sandbox.connect(id, { requestTimeoutMs: 30_000 })
    r.before = await readCounter(sbx)
    await sleep(1_200)
    const out = await sbx.commands.run(`cat ${COUNTER}; echo; cat ${MARKER}`, { requestTimeoutMs: 30_000, timeoutMs: 30_000 })
    const [after, marker] = out.stdout.trim().split(/\s+/)
    r.after = Number(after)
    if (marker !== id) throw new Error(`marker file says ${JSON.stringify(marker)}`)
    if (!(r.after > r.before)) throw new Error(`counter did not advance in 1.2 s: ${r.before} -> ${r.after}`)
    const probe = `written-${Date.now()}`
    await sbx.files.write('/home/user/kubereal-probe', probe)
    const back = await sbx.files.read('/home/user/kubereal-probe')
    if (back !== probe) throw new Error(`file read back ${JSON.stringify(back)}, want ${probe}`)
    r.ok = true
  } catch (err) {
    r.error = msg(err)
  }
  return r
}

async function state (id) {
  try {
    const info = await Sandbox.getInfo(id, { requestTimeoutMs: 30_000 })
    return info.state
  } catch (err) {
    if (err instanceof SandboxNotFoundError) return 'gone'
    return 'error: ' + msg(err)
  }
}

async function createOne () {
  const t0 = Date.now()
  const sbx = await Sandbox.create(opts({ timeoutMs: 300_000 }))
  try {
    const r = await sbx.commands.run('echo created-$((6*7))')
    if (r.stdout !== 'created-42\n') throw new Error(`command printed ${JSON.stringify(r.stdout)}`)
    await sbx.files.write('/tmp/f', 'x')
    if (await sbx.files.read('/tmp/f') !== 'x') throw new Error('file read back wrong')
    return { id: sbx.sandboxId, ms: Date.now() - t0 }
  } finally {
    await Sandbox.kill(sbx.sandboxId).catch(() => {})
  }
}

async function probe (id) {
  const sbx = await Sandbox.connect(id)
  let stop = false
  process.stdin.on('end', () => { stop = true }).on('data', () => {}).resume()
  const deadline = Date.now() + 30 * 60_000 // never outlive a stuck test
  while (!stop && Date.now() < deadline) {
    const t = Date.now()
    const line = { t }
    try {
      const r = await sbx.commands.run(`cat ${COUNTER}`, { requestTimeoutMs: 3_000, timeoutMs: 3_000 })
      line.ok = true
      line.counter = Number(r.stdout.trim())
    } catch (err) {
      line.ok = false
      line.error = msg(err)
    }
    console.log(JSON.stringify(line))
    await sleep(Math.max(0, 250 - (Date.now() - t)))
  }
}

const [verb, ...args] = process.argv.slice(2)
let out
switch (verb) {
  case 'create-counters': out = await createCounters(Number(args[0])); break
  case 'check': out = await pool(args, 5, check); break
  case 'states': out = Object.fromEntries(await pool(args, 5, async (id) => [id, await state(id)])); break
  case 'create-one': out = await createOne(); break
  case 'try-create':
    try {
      const sbx = await Sandbox.create(opts({ timeoutMs: 60_000, requestTimeoutMs: 30_000 }))
      await Sandbox.kill(sbx.sandboxId).catch(() => {})
      out = { ok: true, id: sbx.sandboxId }
    } catch (err) {
      out = { ok: false, error: msg(err) }
    }
    break
  case 'kill': out = Object.fromEntries(await pool(args, 5, async (id) => [id, await Sandbox.kill(id)])); break
  case 'sweep': {
    const left = await Sandbox.list({ query: { metadata: TAG }, limit: 100 }).nextItems()
    await pool(left, 5, (s) => Sandbox.kill(s.sandboxId).catch(() => false))
    out = left.map((s) => s.sandboxId)
    break
  }
  case 'probe': await probe(args[0]); process.exit(0); break
  default: throw new Error(`unknown verb ${verb}`)
}
console.log(JSON.stringify(out))
