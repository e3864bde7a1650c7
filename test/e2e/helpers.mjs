// Shared helpers for the e2e suite. The suite talks to a live Cube through the
// official e2b SDK; run.sh starts Cube and sets these variables.
import { appendFileSync, mkdtempSync, rmSync } from 'node:fs'
import { tmpdir } from 'node:os'
import { join } from 'node:path'
import { Sandbox } from 'e2b'

for (const v of ['E2B_API_URL', 'E2B_SANDBOX_URL', 'E2B_API_KEY']) {
  if (!process.env[v]) {
    throw new Error(`${v} is not set: run the suite with test/e2e/run.sh CUBE_BINARY`)
  }
}

/** Unique per test process, used to tag sandboxes so list filters see only ours. */
export const RUN_ID = `e2e-${process.pid}-${Date.now().toString(36)}`

/** Sandbox options every test uses: short-lived, tagged. */
export function sandboxOpts (extra = {}) {
  return {
    timeoutMs: 120_000,
    requestTimeoutMs: 60_000,
    ...extra,
    metadata: { run: RUN_ID, ...(extra.metadata ?? {}) }
  }
}

/**
 * Creates a sandbox from the default template (or opts.template) and records
 * its id in $CUBE_E2E_IDS_FILE, which run.sh's leak check reads.
 */
export async function newSandbox (extra = {}) {
  const { template, ...rest } = extra
  const opts = sandboxOpts(rest)
  const sbx = template ? await Sandbox.create(template, opts) : await Sandbox.create(opts)
  if (process.env.CUBE_E2E_IDS_FILE) appendFileSync(process.env.CUBE_E2E_IDS_FILE, sbx.sandboxId + '\n')
  return sbx
}

/** Like newSandbox, and kills the sandbox when test t ends. */
export async function createSandbox (t, extra = {}) {
  const sbx = await newSandbox(extra)
  t.after(async () => { await killQuietly(sbx.sandboxId) })
  return sbx
}

/** Kills a sandbox, ignoring "already gone". */
export async function killQuietly (sandboxId) {
  try {
    await Sandbox.kill(sandboxId)
  } catch (err) {
    console.error(`cleanup: kill ${sandboxId}: ${err}`)
  }
}

export const sleep = (ms) => new Promise((resolve) => setTimeout(resolve, ms))

/** Polls fn until it returns a truthy value or timeoutMs passes. */
export async function waitFor (what, fn, { timeoutMs = 15_000, intervalMs = 100 } = {}) {
  const deadline = Date.now() + timeoutMs
  let last
  for (;;) {
    try {
      const v = await fn()
      if (v) return v
    } catch (err) {
      last = err
    }
    if (Date.now() > deadline) {
      throw new Error(`timed out after ${timeoutMs} ms waiting for ${what}${last ? `: ${last}` : ''}`)
    }
    await sleep(intervalMs)
  }
}

/** Kills every sandbox tagged with this process's RUN_ID (register with after()). */
export async function sweep () {
  try {
    const left = await Sandbox.list({ query: { metadata: { run: RUN_ID } } }).nextItems()
    await Promise.all(left.map((s) => killQuietly(s.sandboxId)))
  } catch (err) {
    console.error(`cleanup sweep: ${err}`)
  }
  for (const dir of tempDirs.splice(0)) {
    rmSync(dir, { recursive: true, force: true })
  }
}

const tempDirs = []

/** A new directory under the OS temp dir, removed by sweep(). */
export function tempDir (prefix) {
  const dir = mkdtempSync(join(tmpdir(), prefix))
  tempDirs.push(dir)
  return dir
}
