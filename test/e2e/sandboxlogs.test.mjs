// Sandbox logs through the official CLI (@e2b/cli 2.19.0: `e2b sandbox logs
// ID`, which reads GET /sandboxes/{id}/logs) and the v2 route: envd's own
// lines (process starts and ends) and the node's lifecycle lines, also after
// the sandbox died. The SDK (e2b 2.51.0) has no sandbox-logs call.
import { execFile } from 'node:child_process'
import { join } from 'node:path'
import { promisify } from 'node:util'
import { after, describe, test } from 'node:test'
import assert from 'node:assert/strict'
import { createSandbox, killQuietly, sweep, tempDir, waitFor } from './helpers.mjs'

after(sweep)

const run = promisify(execFile)
const env = { ...process.env, NO_UPDATE_NOTIFIER: '1', HOME: tempDir('cube-cli-home-') }
const cli = (...args) => run(join(import.meta.dirname, 'node_modules', '.bin', 'e2b'), args, { env })
// util.inspect in the CLI's pretty format colours its output even in a pipe.
// eslint-disable-next-line no-control-regex
const plain = (s) => s.replace(/\x1b\[[0-9;]*m/g, '')

async function apiLogs (id, query = '') {
  const res = await fetch(`${process.env.E2B_API_URL}/v2/sandboxes/${id}/logs${query}`, {
    headers: { 'X-API-Key': process.env.E2B_API_KEY }
  })
  const body = await res.json()
  return { status: res.status, body }
}

describe('sandbox logs', { timeout: 180_000 }, () => {
  test('e2b sandbox logs shows process starts and ends, as pretty text and JSON', async (t) => {
    const sbx = await createSandbox(t)
    await sbx.commands.run('echo visible-marker')
    await assert.rejects(sbx.commands.run('exit 3'), (err) => err.exitCode === 3)

    // The lines arrive through the node's pipe reader: wait for the last.
    await waitFor('the process-ended line of exit 3', async () => {
      const { body } = await apiLogs(sbx.sandboxId, '?search=process+ended')
      return body.logs.some((l) => l.fields.exitCode === '3')
    })
    const { stdout } = await cli('sandbox', 'logs', sbx.sandboxId)
    const text = plain(stdout)
    assert.match(text, new RegExp(`Logs for sandbox ${sbx.sandboxId}`))
    assert.match(text, /INFO.*logger: 'cubelet'.*message: 'sandbox created'/)
    assert.match(text, /INFO.*logger: 'process'.*message: 'process started'/)
    assert.match(text, /WARN.*exitCode: '3'.*logger: 'process'.*message: 'process ended'/)

    const json = await cli('sandbox', 'logs', sbx.sandboxId, '--format', 'json')
    const lines = json.stdout.trim().split('\n').map((l) => JSON.parse(plain(l)))
    assert.ok(lines.length >= 4, `json lines: ${json.stdout}`)
    for (const l of lines) {
      assert.ok(!Number.isNaN(Date.parse(l.timestamp)), `timestamp of ${JSON.stringify(l)}`)
      assert.equal(typeof l.message, 'string')
    }
    const started = lines.filter((l) => l.message === 'process started')
    assert.ok(started.some((l) => l.args.includes('echo visible-marker')), JSON.stringify(started))

    // --level WARN keeps the failed process's end and drops the info lines.
    const warn = plain((await cli('sandbox', 'logs', sbx.sandboxId, '--level', 'WARN')).stdout)
    assert.match(warn, /process ended/)
    assert.doesNotMatch(warn, /process started|sandbox created/)

    // v2: structured entries, level and search filters, backward paging.
    const v2 = await apiLogs(sbx.sandboxId, '?direction=backward&level=warn&limit=1')
    assert.equal(v2.status, 200)
    assert.equal(v2.body.logs.length, 1)
    assert.equal(v2.body.logs[0].level, 'warn')
    assert.equal(v2.body.logs[0].fields.logger, 'process')
    assert.equal((await apiLogs(sbx.sandboxId, '?direction=sideways')).status, 400)
  })

  test('a sandbox whose envd was killed says so in its logs, after it is gone', async (t) => {
    const sbx = await createSandbox(t)
    const id = sbx.sandboxId
    await sbx.commands.run('echo before-the-kill')
    // kill -9 envd from inside: pid 1 (cube-reaper) ends with it, and the
    // sandbox with them. The command's own stream dies too.
    await sbx.commands.run('pkill -9 -x envd', { user: 'root', requestTimeoutMs: 10_000 }).catch(() => {})
    const died = await waitFor('the sandbox-died line', async () => {
      const { status, body } = await apiLogs(id, '?level=error')
      return status === 200 && body.logs.find((l) => l.message.startsWith('sandbox died unexpectedly'))
    }, { timeoutMs: 60_000, intervalMs: 500 })
    assert.equal(died.fields.logger, 'cubelet')
    assert.ok(died.fields.signal === 'killed' || died.fields.exitCode !== '0', JSON.stringify(died))

    // The node removed the sandbox (all-in-one: the server forgets it at
    // once; cluster: when the heartbeat says so or at a kill, which then
    // finds nothing to kill). Its logs stay for the retention.
    await killQuietly(id)
    const res = await fetch(`${process.env.E2B_API_URL}/sandboxes/${id}`, { headers: { 'X-API-Key': process.env.E2B_API_KEY } })
    assert.equal(res.status, 404)
    const text = plain((await cli('sandbox', 'logs', id)).stdout)
    assert.match(text, /ERROR.*message: 'sandbox died unexpectedly: its init \(envd\) ended with/)
    assert.match(text, /process started/)

    // An id no node ever had is a 404, for the CLI too.
    const unknown = await apiLogs('inosuchsandbox0000000')
    assert.equal(unknown.status, 404)
    await assert.rejects(cli('sandbox', 'logs', 'inosuchsandbox0000000'), /404|not found/i)
  })
})
