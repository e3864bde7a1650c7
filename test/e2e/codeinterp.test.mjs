// The official @e2b/code-interpreter client (pinned 2.8.0) against Cube's
// built-in template code-interpreter-v1 and its server on port 49999
// (cmd/cube-interp).
import { appendFileSync } from 'node:fs'
import { after, before, describe, test } from 'node:test'
import assert from 'node:assert/strict'
import { Sandbox } from '@e2b/code-interpreter'
import { NotFoundError, SandboxError, ServiceBusyError, TimeoutError } from 'e2b'
import { killQuietly, sandboxOpts, sleep, sweep } from './helpers.mjs'

after(sweep)

// The template is built in the background after `cube up` starts (minutes
// the first time on a machine, then from the debootstrap cache): until it
// is ready a create is answered 503 "still being built".
const BUILD_WAIT_MS = Number(process.env.CUBE_E2E_INTERP_BUILD_WAIT_MS ?? 20 * 60_000)

async function createInterpSandbox () {
  const deadline = Date.now() + BUILD_WAIT_MS
  for (;;) {
    try {
      const sbx = await Sandbox.create(sandboxOpts())
      if (process.env.CUBE_E2E_IDS_FILE) appendFileSync(process.env.CUBE_E2E_IDS_FILE, sbx.sandboxId + '\n')
      return sbx
    } catch (err) {
      if (!(err instanceof ServiceBusyError) || !/still being built/.test(err.message) || Date.now() > deadline) throw err
      await sleep(5_000)
    }
  }
}

describe('code interpreter', { timeout: BUILD_WAIT_MS + 300_000 }, () => {
  let sbx
  before(async () => {
    const start = Date.now()
    sbx = await createInterpSandbox()
    console.log(`code-interpreter sandbox ${sbx.sandboxId} after ${Date.now() - start} ms`)
  })
  after(async () => { if (sbx) await killQuietly(sbx.sandboxId) })

  test('state persists between runs', async () => {
    await sbx.runCode('x = 41')
    const ex = await sbx.runCode('x + 1')
    assert.equal(ex.text, '42')
    assert.equal(ex.error, undefined)
    assert.ok(ex.executionCount >= 2, `executionCount ${ex.executionCount}`)
  })

  test('stdout and stderr callbacks, in order', async () => {
    const seen = []
    const ex = await sbx.runCode(
      'import sys\nprint("out1", flush=True)\nprint("err1", file=sys.stderr, flush=True)\nprint("out2", flush=True)',
      { onStdout: (m) => seen.push(['out', m.line]), onStderr: (m) => seen.push(['err', m.line]) })
    assert.deepEqual(seen, [['out', 'out1\n'], ['err', 'err1\n'], ['out', 'out2\n']])
    assert.deepEqual(ex.logs.stdout, ['out1\n', 'out2\n'])
    assert.deepEqual(ex.logs.stderr, ['err1\n'])
  })

  test('an exception has name, value and traceback', async () => {
    let cb
    const ex = await sbx.runCode('def f():\n    raise ValueError("bad")\nf()', { onError: (e) => { cb = e } })
    assert.equal(ex.error.name, 'ValueError')
    assert.equal(ex.error.value, 'bad')
    assert.match(ex.error.traceback, /ValueError/)
    assert.equal(cb?.name, 'ValueError')
  })

  test('pandas DataFrame as HTML', async () => {
    const ex = await sbx.runCode("import pandas as pd\npd.DataFrame({'a': [1, 2], 'b': [3, 4]})")
    assert.equal(ex.error, undefined)
    const main = ex.results.find((r) => r.isMainResult)
    assert.match(main.html, /<table/)
    assert.ok(main.formats().includes('html'))
  })

  test('matplotlib figure as PNG', async () => {
    const ex = await sbx.runCode('import matplotlib.pyplot as plt\nplt.plot([1, 3, 2])\nplt.show()')
    assert.equal(ex.error, undefined)
    const png = ex.results.find((r) => r.png)
    assert.ok(png, `results: ${JSON.stringify(ex.results.map((r) => r.formats()))}`)
    assert.equal(Buffer.from(png.png, 'base64').subarray(1, 4).toString(), 'PNG')
  })

  test('envs apply to one run', async () => {
    const ex = await sbx.runCode("import os\nos.environ.get('CUBE_ONCE')", { envs: { CUBE_ONCE: 'yes' } })
    assert.equal(ex.text, 'yes')
    const after = await sbx.runCode("import os\nstr(os.environ.get('CUBE_ONCE'))")
    assert.equal(after.text, 'None')
  })

  test('contexts: isolated, listed, restarted, removed', async () => {
    const ctx = await sbx.createCodeContext({ cwd: '/tmp', language: 'python' })
    assert.equal(ctx.cwd, '/tmp')
    await sbx.runCode('v = "ctx"', { context: ctx })
    await sbx.runCode('v = "default"')
    assert.equal((await sbx.runCode('v', { context: ctx })).text, 'ctx')
    assert.equal((await sbx.runCode('import os\nos.getcwd()', { context: ctx })).text, '/tmp')
    assert.ok((await sbx.listCodeContexts()).some((c) => c.id === ctx.id))
    await sbx.restartCodeContext(ctx)
    assert.equal((await sbx.runCode('v', { context: ctx })).error?.name, 'NameError')
    assert.equal((await sbx.runCode('v')).text, 'default')
    await sbx.removeCodeContext(ctx.id)
    // requestTimeoutMs 0: the 2.8.0 client leaves its request timer running
    // when it throws for an HTTP error, which would hold node for 60 s.
    await assert.rejects(sbx.runCode('1', { context: ctx, requestTimeoutMs: 0 }), NotFoundError)
  })

  test('a timeout interrupts the kernel; the next run works', async () => {
    await sbx.runCode('kept = 7')
    await assert.rejects(sbx.runCode('while True:\n    pass', { timeoutMs: 2_000 }), TimeoutError)
    const ex = await sbx.runCode('kept * 6')
    assert.equal(ex.text, '42')
  })

  test('a kernel killed from inside is an error; the context works after restart', async () => {
    const ctx = await sbx.createCodeContext()
    const ex = await sbx.runCode('import os\nos._exit(1)', { context: ctx })
    assert.equal(ex.error?.name, 'KernelDied')
    await sbx.restartCodeContext(ctx)
    assert.equal((await sbx.runCode('6 * 7', { context: ctx })).text, '42')
  })

  test('the sandbox access token guards /execute', async () => {
    assert.ok(sbx.envdAccessToken, 'Cube sandboxes have an envd access token')
    // As runCode sends it, with or without the token.
    const post = (code, token) => fetch(`${sbx.jupyterUrl}/execute`, {
      method: 'POST',
      headers: {
        'Content-Type': 'application/json',
        'E2b-Sandbox-Id': sbx.sandboxId,
        'E2b-Sandbox-Port': '49999',
        ...(token === undefined ? {} : { 'X-Access-Token': token })
      },
      body: JSON.stringify({ code })
    })
    for (const token of [undefined, 'wrong']) {
      const res = await post('refused = 1', token)
      const body = await res.text()
      assert.equal(res.status, 401, `token ${token}: ${res.status} ${body}`)
      assert.match(body, /X-Access-Token/)
    }
    const ok = await post('allowed = 1', sbx.envdAccessToken)
    assert.equal(ok.status, 200)
    assert.match(await ok.text(), /end_of_execution/)
    assert.equal((await sbx.runCode("('refused' in globals(), 'allowed' in globals())")).text, '(False, True)')
  })

  test('unknown language: a clear error', async () => {
    await assert.rejects(sbx.runCode('1', { language: 'cobol', requestTimeoutMs: 0 }), (err) => {
      assert.ok(err instanceof SandboxError, `got ${err}`)
      assert.match(String(err), /400/)
      return true
    })
  })
})
