// commands.run, envs, cwd, users, streaming, background, stdin, PTY.
import { after, before, describe, test } from 'node:test'
import assert from 'node:assert/strict'
import { CommandExitError } from 'e2b'
import { killQuietly, newSandbox, sweep, waitFor } from './helpers.mjs'

after(sweep)

describe('commands', { concurrency: true, timeout: 120_000 }, () => {
  let sbx
  before(async () => {
    sbx = await newSandbox({ envs: { CUBE_A: 'from-create', CUBE_SHARED: 'create' } })
  })
  after(async () => { if (sbx) await killQuietly(sbx.sandboxId) })

  test('stdout, stderr and exit code', async () => {
    const r = await sbx.commands.run('echo out; echo err >&2')
    assert.equal(r.exitCode, 0)
    assert.equal(r.stdout, 'out\n')
    assert.equal(r.stderr, 'err\n')
  })

  test('non-zero exit throws CommandExitError', async () => {
    await assert.rejects(sbx.commands.run('echo partial; echo bad >&2; exit 3'), (err) => {
      assert.ok(err instanceof CommandExitError, `got ${err}`)
      assert.equal(err.exitCode, 3)
      assert.equal(err.stdout, 'partial\n')
      assert.equal(err.stderr, 'bad\n')
      return true
    })
  })

  test('envs from create and from run; run wins', async () => {
    const r = await sbx.commands.run('echo "$CUBE_A|$CUBE_B|$CUBE_SHARED"', {
      envs: { CUBE_B: 'from-run', CUBE_SHARED: 'run' }
    })
    assert.equal(r.stdout, 'from-create|from-run|run\n')
  })

  test('cwd', async () => {
    assert.equal((await sbx.commands.run('pwd', { cwd: '/tmp' })).stdout, '/tmp\n')
    assert.equal((await sbx.commands.run('pwd', { cwd: '/' })).stdout, '/\n')
    await assert.rejects(sbx.commands.run('pwd', { cwd: '/does/not/exist' }))
  })

  test('user root vs user', async () => {
    const asRoot = await sbx.commands.run('whoami; id -u; echo $HOME', { user: 'root' })
    assert.equal(asRoot.stdout, 'root\n0\n/root\n')
    const asUser = await sbx.commands.run('whoami; id -u; echo $HOME; pwd', { user: 'user' })
    assert.equal(asUser.stdout, 'user\n1000\n/home/user\n/home/user\n')
    // Like E2B, the default user is `user`.
    assert.equal((await sbx.commands.run('whoami')).stdout, 'user\n')
    // user cannot write where only root may.
    await assert.rejects(sbx.commands.run('touch /etc/cube-e2e-denied', { user: 'user' }), CommandExitError)
  })

  test('streaming onStdout/onStderr callbacks arrive over time', async () => {
    const chunks = []
    const errChunks = []
    const r = await sbx.commands.run('for i in 1 2 3 4; do echo line$i; echo e$i >&2; sleep 0.4; done', {
      onStdout: (d) => chunks.push({ d, at: Date.now() }),
      onStderr: (d) => errChunks.push(d)
    })
    assert.equal(r.stdout, 'line1\nline2\nline3\nline4\n')
    assert.equal(chunks.map((c) => c.d).join(''), r.stdout)
    assert.equal(errChunks.join(''), 'e1\ne2\ne3\ne4\n')
    assert.ok(chunks.length >= 3, `want several chunks, got ${JSON.stringify(chunks)}`)
    // Four lines 400 ms apart span 1200 ms when streamed, ~0 when buffered to
    // the end; a loaded CI machine may deliver the first two together.
    const span = chunks.at(-1).at - chunks[0].at
    assert.ok(span >= 500, `chunks were not streamed (span ${span} ms)`)
  })

  test('background command and kill', async () => {
    const h = await sbx.commands.run('sleep 600', { background: true })
    assert.ok(h.pid > 0)
    const listed = await sbx.commands.list()
    assert.ok(listed.some((p) => p.pid === h.pid), 'background process not listed')
    assert.equal(await h.kill(), true)
    await assert.rejects(h.wait(), CommandExitError)
    await waitFor('killed process to leave the list', async () =>
      !(await sbx.commands.list()).some((p) => p.pid === h.pid))
    assert.equal(await sbx.commands.kill(h.pid), false)
  })

  test('stdin: sendStdin then closeStdin', async () => {
    const h = await sbx.commands.run('cat; echo done', { background: true, stdin: true })
    await h.sendStdin('hello ')
    await sbx.commands.sendStdin(h.pid, new TextEncoder().encode('stdin\n'))
    await sbx.commands.closeStdin(h.pid)
    const r = await h.wait()
    assert.equal(r.exitCode, 0)
    assert.equal(r.stdout, 'hello stdin\ndone\n')
  })

  test('PTY: input is echoed and executed', async () => {
    const dec = new TextDecoder()
    let out = ''
    const h = await sbx.pty.create({ cols: 80, rows: 24, onData: (d) => { out += dec.decode(d, { stream: true }) } })
    try {
      await sbx.pty.sendInput(h.pid, new TextEncoder().encode('echo pty-$((40+2)); tty\n'))
      await waitFor('pty output', () => out.includes('pty-$((40+2))') && out.includes('pty-42') && out.includes('/dev/pts/'))
      await sbx.pty.resize(h.pid, { cols: 100, rows: 30 })
      await sbx.pty.sendInput(h.pid, new TextEncoder().encode('stty size\n'))
      await waitFor('resized pty', () => out.includes('30 100'))
      await sbx.pty.sendInput(h.pid, new TextEncoder().encode('exit\n'))
      const r = await h.wait()
      assert.equal(r.exitCode, 0)
    } finally {
      await sbx.pty.kill(h.pid).catch(() => {})
    }
  })

  test('python3 works', async () => {
    const r = await sbx.commands.run('python3 -c "import sys, json; print(json.dumps({\'sum\': sum(range(10)), \'v\': sys.version_info[0]}))"')
    assert.deepEqual(JSON.parse(r.stdout), { sum: 45, v: 3 })
  })

  test('hostname is the sandbox id', async () => {
    assert.equal((await sbx.commands.run('cat /proc/sys/kernel/hostname')).stdout.trim(), sbx.sandboxId)
  })

  test('/etc/resolv.conf is present and non-empty', async () => {
    // Only read it: the suite sends no traffic outside the machine.
    const r = await sbx.commands.run('cat /etc/resolv.conf')
    assert.match(r.stdout, /nameserver\s+\S+/)
  })
})
