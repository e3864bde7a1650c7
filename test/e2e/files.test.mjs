// Filesystem: read/write (text and binary), list, makeDir, rename, remove,
// exists, watchDir.
import { after, before, describe, test } from 'node:test'
import assert from 'node:assert/strict'
import { randomBytes } from 'node:crypto'
import { FileNotFoundError } from 'e2b'
import { killQuietly, newSandbox, sweep, waitFor } from './helpers.mjs'

after(sweep)

describe('files', { concurrency: true, timeout: 120_000 }, () => {
  let sbx
  before(async () => { sbx = await newSandbox() })
  after(async () => { if (sbx) await killQuietly(sbx.sandboxId) })

  test('write and read text', async () => {
    const info = await sbx.files.write('/home/user/text/hello.txt', 'héllo wörld\n')
    assert.equal(info.path, '/home/user/text/hello.txt')
    assert.equal(await sbx.files.read('/home/user/text/hello.txt'), 'héllo wörld\n')
    // Relative paths resolve against the user's home; files belong to user.
    assert.equal(await sbx.files.read('text/hello.txt'), 'héllo wörld\n')
    const owner = await sbx.commands.run('stat -c %U /home/user/text/hello.txt')
    assert.equal(owner.stdout, 'user\n')
    // Overwrite.
    await sbx.files.write('/home/user/text/hello.txt', 'second')
    assert.equal(await sbx.files.read('/home/user/text/hello.txt'), 'second')
  })

  test('10 MiB binary round trip', async () => {
    const data = randomBytes(10 * 1024 * 1024)
    const ab = data.buffer.slice(data.byteOffset, data.byteOffset + data.length)
    await sbx.files.write('/tmp/blob.bin', ab)
    const back = await sbx.files.read('/tmp/blob.bin', { format: 'bytes' })
    assert.equal(back.length, data.length)
    assert.ok(Buffer.from(back).equals(data), 'binary content differs')
    const sum = await sbx.commands.run('sha256sum /tmp/blob.bin | cut -d" " -f1')
    const { createHash } = await import('node:crypto')
    assert.equal(sum.stdout.trim(), createHash('sha256').update(data).digest('hex'))
  })

  test('read of a missing file throws FileNotFoundError', async () => {
    await assert.rejects(sbx.files.read('/home/user/nope.txt'), FileNotFoundError)
  })

  test('list, makeDir, rename, remove, exists', async () => {
    const dir = '/home/user/ops'
    assert.equal(await sbx.files.makeDir(dir), true)
    assert.equal(await sbx.files.makeDir(dir), false)
    await sbx.files.write(`${dir}/a.txt`, 'a')
    await sbx.files.makeDir(`${dir}/sub`)
    const entries = await sbx.files.list(dir)
    const byName = Object.fromEntries(entries.map((e) => [e.name, e]))
    assert.deepEqual(Object.keys(byName).sort(), ['a.txt', 'sub'])
    assert.equal(byName['a.txt'].type, 'file')
    assert.equal(byName['a.txt'].path, `${dir}/a.txt`)
    assert.equal(byName['a.txt'].size, 1)
    assert.equal(byName.sub.type, 'dir')

    const moved = await sbx.files.rename(`${dir}/a.txt`, `${dir}/b.txt`)
    assert.equal(moved.name, 'b.txt')
    assert.equal(await sbx.files.exists(`${dir}/a.txt`), false)
    assert.equal(await sbx.files.exists(`${dir}/b.txt`), true)
    assert.equal(await sbx.files.read(`${dir}/b.txt`), 'a')

    await sbx.files.remove(`${dir}/b.txt`)
    assert.equal(await sbx.files.exists(`${dir}/b.txt`), false)
    await sbx.files.remove(dir)
    assert.equal(await sbx.files.exists(dir), false)
    await assert.rejects(sbx.files.list(dir), FileNotFoundError)
  })

  test('watchDir reports a write', async () => {
    const dir = '/home/user/watched'
    await sbx.files.makeDir(dir)
    const events = []
    const w = await sbx.files.watchDir(dir, (e) => { events.push(e) })
    try {
      await sbx.files.write(`${dir}/new.txt`, 'x')
      await waitFor('watch event for new.txt', () => events.some((e) => e.name === 'new.txt'))
      const types = new Set(events.filter((e) => e.name === 'new.txt').map((e) => e.type))
      assert.ok(types.has('create') || types.has('write'), `event types: ${[...types]}`)
    } finally {
      await w.stop()
    }
  })
})
