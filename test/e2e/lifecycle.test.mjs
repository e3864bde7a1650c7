// Control plane: create, getInfo, list + pagination, connect, timeouts,
// expiry, kill, authentication and not-found errors.
import { after, describe, test } from 'node:test'
import assert from 'node:assert/strict'
import { AuthenticationError, Sandbox, SandboxNotFoundError } from 'e2b'
import { RUN_ID, createSandbox, sandboxOpts, sweep, waitFor } from './helpers.mjs'

const UNKNOWN_ID = 'i0000000000000000000000'

after(sweep)

describe('lifecycle', { concurrency: true, timeout: 150_000 }, () => {
  test('create default template, getInfo', async (t) => {
    const before = Date.now()
    const sbx = await createSandbox(t, { metadata: { purpose: 'info', 'a b': 'x&y=z' } })
    assert.match(sbx.sandboxId, /^[a-z0-9]+$/)
    const info = await sbx.getInfo()
    assert.equal(info.sandboxId, sbx.sandboxId)
    assert.equal(info.templateId, 'base')
    assert.equal(info.state, 'running')
    assert.equal(info.cpuCount, 2)
    assert.equal(info.memoryMB, 512)
    assert.deepEqual(info.metadata, { run: RUN_ID, purpose: 'info', 'a b': 'x&y=z' })
    assert.ok(info.startedAt.getTime() >= before - 5_000, `startedAt ${info.startedAt.toISOString()}`)
    const ttl = info.endAt.getTime() - info.startedAt.getTime()
    assert.ok(Math.abs(ttl - 120_000) < 5_000, `endAt - startedAt = ${ttl} ms, want ~120 s`)
    assert.deepEqual((await Sandbox.getInfo(sbx.sandboxId)).metadata, info.metadata)
    assert.equal(await sbx.isRunning(), true)
  })

  test('list with metadata filter and pagination', async (t) => {
    const group = `list-${RUN_ID}`
    const created = await Promise.all([1, 2, 3].map((n) =>
      createSandbox(t, { metadata: { group, n: String(n), 'odd key&': 'v=1 &2' } })))
    const want = created.map((s) => s.sandboxId).sort()

    const all = await Sandbox.list({ query: { metadata: { group } } }).nextItems()
    assert.deepEqual(all.map((s) => s.sandboxId).sort(), want)
    for (const s of all) {
      assert.equal(s.state, 'running')
      assert.equal(s.metadata.group, group)
    }
    // Triple-encoded metadata with special characters still matches exactly.
    const special = await Sandbox.list({ query: { metadata: { 'odd key&': 'v=1 &2', n: '2' } } }).nextItems()
    assert.deepEqual(special.map((s) => s.sandboxId), [created[1].sandboxId])
    assert.deepEqual(await Sandbox.list({ query: { metadata: { group, n: 'none' } } }).nextItems(), [])

    const pager = Sandbox.list({ query: { metadata: { group } }, limit: 1 })
    const seen = []
    let pages = 0
    while (pager.hasNext && pages < 10) {
      const items = await pager.nextItems()
      pages++
      assert.ok(items.length <= 1, `page of ${items.length} with limit 1`)
      seen.push(...items.map((s) => s.sandboxId))
    }
    assert.ok(pages >= 3, `only ${pages} pages`)
    assert.equal(pager.hasNext, false)
    assert.deepEqual(seen.sort(), want)
  })

  test('instance kill, then kill returns false; killed sandbox is gone', async (t) => {
    const sbx = await createSandbox(t)
    await sbx.kill()
    assert.equal(await Sandbox.kill(sbx.sandboxId), false)
    await assert.rejects(Sandbox.getInfo(sbx.sandboxId), SandboxNotFoundError)
    const listed = await Sandbox.list({ query: { metadata: { run: RUN_ID } } }).nextItems()
    assert.ok(!listed.some((s) => s.sandboxId === sbx.sandboxId), 'killed sandbox still listed')
  })

  test('static kill returns true then false', async (t) => {
    const sbx = await createSandbox(t)
    assert.equal(await Sandbox.kill(sbx.sandboxId), true)
    assert.equal(await Sandbox.kill(sbx.sandboxId), false)
    assert.equal(await sbx.isRunning(), false)
  })

  test('connect by id, then run a command', async (t) => {
    const sbx = await createSandbox(t, { envs: { CUBE_CONNECT: 'yes' } })
    await sbx.files.write('/home/user/marker', 'm')
    const again = await Sandbox.connect(sbx.sandboxId)
    assert.equal(again.sandboxId, sbx.sandboxId)
    const r = await again.commands.run('cat /home/user/marker; echo " $CUBE_CONNECT"')
    assert.equal(r.stdout, 'm yes\n')
  })

  test('setTimeout extends and shortens endAt', async (t) => {
    const sbx = await createSandbox(t)
    await sbx.setTimeout(600_000)
    let info = await sbx.getInfo()
    let left = info.endAt.getTime() - Date.now()
    assert.ok(left > 550_000 && left <= 605_000, `after setTimeout(600 s) ${left} ms left`)
    await Sandbox.setTimeout(sbx.sandboxId, 60_000)
    info = await sbx.getInfo()
    left = info.endAt.getTime() - Date.now()
    assert.ok(left > 50_000 && left <= 65_000, `after setTimeout(60 s) ${left} ms left`)
    await assert.rejects(Sandbox.setTimeout(UNKNOWN_ID, 10_000), SandboxNotFoundError)
  })

  test('sandbox expires after its timeout', async (t) => {
    const sbx = await createSandbox(t, { timeoutMs: 3_000 })
    assert.equal((await sbx.commands.run('echo alive')).stdout, 'alive\n')
    await waitFor('expiry', async () => {
      try {
        await Sandbox.getInfo(sbx.sandboxId)
        return false
      } catch (err) {
        if (err instanceof SandboxNotFoundError) return true
        throw err
      }
    }, { timeoutMs: 30_000, intervalMs: 500 })
    assert.equal(await Sandbox.kill(sbx.sandboxId), false)
    await assert.rejects(Sandbox.connect(sbx.sandboxId), SandboxNotFoundError)
    assert.equal(await sbx.isRunning(), false)
  })

  test('unknown id: SandboxNotFoundError on getInfo and connect, false on kill', async () => {
    await assert.rejects(Sandbox.getInfo(UNKNOWN_ID), SandboxNotFoundError)
    await assert.rejects(Sandbox.connect(UNKNOWN_ID), SandboxNotFoundError)
    assert.equal(await Sandbox.kill(UNKNOWN_ID), false)
  })

  test('wrong API key: AuthenticationError', async () => {
    const apiKey = 'wrong-' + RUN_ID
    await assert.rejects(Sandbox.create(sandboxOpts({ apiKey })), AuthenticationError)
    await assert.rejects(Sandbox.list({ apiKey }).nextItems(), AuthenticationError)
    await assert.rejects(Sandbox.getInfo(UNKNOWN_ID, { apiKey }), AuthenticationError)
    await assert.rejects(Sandbox.kill(UNKNOWN_ID, { apiKey }), AuthenticationError)
  })

  test('unknown template is refused', async () => {
    await assert.rejects(Sandbox.create('no-such-template-' + process.pid, sandboxOpts({ metadata: { purpose: 'never' } })), (err) => {
      assert.ok(!(err instanceof AuthenticationError), `got ${err}`)
      return true
    })
    // Nothing half-created is left behind.
    const listed = await Sandbox.list({ query: { metadata: { run: RUN_ID, purpose: 'never' } } }).nextItems()
    assert.deepEqual(listed, [])
  })
})
