// Templates built with the official SDK's Template builder (e2b 2.51.0)
// and managed with the official CLI (@e2b/cli 2.19.0): the steps run in a
// Cube sandbox of the parent template, which the node commits as the new
// template (internal/templatebuild, internal/cubelet/commit.go).
import { execFile } from 'node:child_process'
import { mkdirSync, writeFileSync, chmodSync } from 'node:fs'
import { join } from 'node:path'
import { promisify } from 'node:util'
import { after, before, describe, test } from 'node:test'
import assert from 'node:assert/strict'
import { BuildError, Sandbox, Template } from 'e2b'
import { RUN_ID, killQuietly, newSandbox, sweep, tempDir } from './helpers.mjs'

after(sweep)

const run = promisify(execFile)
const NAME = `e2e-tpl-${process.pid}`
// The ready command: base has bash (its /dev/tcp) but no ss or curl.
const READY = "bash -c 'exec 3<>/dev/tcp/127.0.0.1/8000'"

/** A context dir with a file and a directory tree to copy. */
function contextDir () {
  const dir = tempDir('cube-tpl-ctx-')
  writeFileSync(join(dir, 'hello.txt'), 'hello from the build context\n')
  mkdirSync(join(dir, 'app', 'sub'), { recursive: true })
  writeFileSync(join(dir, 'app', 'main.py'), 'print("main")\n')
  chmodSync(join(dir, 'app', 'main.py'), 0o755)
  writeFileSync(join(dir, 'app', 'sub', 'data.json'), '{"k": 1}\n')
  writeFileSync(join(dir, 'app', 'index.html'), 'served by the start command\n')
  return dir
}

// The first step names this run, so the first build runs every step (the
// step cache is keyed by the steps, not by the template's name).
function builder (ctx, lastEnv) {
  return Template({ fileContextPath: ctx })
    .fromTemplate('base')
    .runCmd(`mkdir -p /opt/tools && echo root-made > /opt/tools/marker && echo ${RUN_ID} > /opt/tools/run`, { user: 'root' })
    .runCmd('echo user-made > /home/user/user-file', { user: 'user' })
    .copy('hello.txt', '/home/user/hello.txt', { user: 'user', mode: 0o644 })
    .copy('app', '/home/user/app/')
    .setWorkdir('/home/user/app')
    .setUser('user')
    .setStartCmd('python3 -m http.server 8000', READY)
    .setEnvs({ FOO: 'bar', LAST: lastEnv })
}

async function build (t, name, logs) {
  const start = Date.now()
  const info = await Template.build(t, name, { onBuildLogs: (e) => logs.push(`${e.level} ${e.message}`) })
  return { info, ms: Date.now() - start }
}

describe('template builds', { timeout: 900_000 }, () => {
  let ctx
  before(() => { ctx = contextDir() })

  test('Template.build, then sandboxes of it see the steps and run the start command', async () => {
    const logs = []
    const first = await build(builder(ctx, 'one'), NAME, logs)
    console.log(`first build of ${NAME}: ${first.ms} ms`)
    assert.equal(first.info.templateId, NAME)
    assert.ok(await Template.exists(NAME), 'Template.exists after the build')
    assert.equal(await Template.exists(`${NAME}-never-built`), false)

    const sbx = await newSandbox({ template: NAME })
    try {
      const sh = async (cmd, opts) => (await sbx.commands.run(cmd, opts)).stdout.trim()
      assert.equal(await sh('cat /opt/tools/marker'), 'root-made')
      assert.equal(await sh('stat -c %U /opt/tools/marker'), 'root')
      assert.equal(await sh('cat /home/user/user-file && stat -c %U /home/user/user-file'), 'user-made\nuser')
      assert.equal(await sh('cat /home/user/hello.txt && stat -c "%U %a" /home/user/hello.txt'), 'hello from the build context\nuser 644')
      assert.equal(await sh('cat /home/user/app/sub/data.json'), '{"k": 1}')
      assert.equal(await sh('stat -c %a /home/user/app/main.py'), '755')
      assert.equal(await sh('echo $FOO-$LAST'), 'bar-one')
      assert.equal(await sh('pwd'), '/home/user/app')
      assert.equal(await sh('whoami'), 'user')
      // The start command serves the workdir on port 8000, through the proxy.
      const res = await fetch(process.env.E2B_SANDBOX_URL, {
        headers: { 'E2b-Sandbox-Id': sbx.sandboxId, 'E2b-Sandbox-Port': '8000', 'X-Access-Token': sbx.trafficAccessToken ?? '' }
      })
      assert.equal(res.status, 200)
      assert.equal(await res.text(), 'served by the start command\n')
    } finally {
      await killQuietly(sbx.sandboxId)
    }

    // Only the last step changed: the others come from the step cache.
    const relogs = []
    const second = await build(builder(ctx, 'two'), NAME, relogs)
    console.log(`rebuild with the last step changed: ${second.ms} ms (first ${first.ms} ms)`)
    const cached = relogs.filter((l) => /cached/i.test(l))
    assert.ok(cached.length >= 4, `cached steps in the rebuild's log:\n${relogs.join('\n')}`)
    assert.ok(second.ms < first.ms, `rebuild ${second.ms} ms, first build ${first.ms} ms`)
    const again = await newSandbox({ template: NAME })
    try {
      assert.equal((await again.commands.run('echo $LAST')).stdout.trim(), 'two')
    } finally {
      await killQuietly(again.sandboxId)
    }
  })

  test('a failing step raises BuildError with its output', async () => {
    const t = Template().fromTemplate('base').runCmd('echo about-to-fail; echo oops >&2; exit 7')
    await assert.rejects(Template.build(t, `${NAME}-fails`), (err) => {
      assert.ok(err instanceof BuildError, `${err}`)
      assert.match(err.message, /status 7/)
      assert.match(err.message, /oops|about-to-fail/)
      return true
    })
    assert.equal(await Template.exists(`${NAME}-fails`), false)
  })

  test('tags: name:tag builds, sandboxes of a tag, assignTags, removeTags, getTags', async () => {
    const name = `${NAME}-tags`
    const marker = (what) => Template().fromTemplate('base').runCmd(`echo ${what}-${RUN_ID} > /etc/tag-marker`, { user: 'root' })
    const v1 = await Template.build(marker('v1'), `${name}:v1`, { tags: ['prod'] })
    assert.equal(v1.templateId, name)
    assert.deepEqual([...v1.tags].sort(), ['prod', 'v1'])
    const dflt = await Template.build(marker('default'), name)
    assert.deepEqual(dflt.tags, ['default'])
    const tagMap = async () => Object.fromEntries((await Template.getTags(name)).map((t) => [t.tag, t.buildId]))
    assert.deepEqual(await tagMap(), { default: dflt.buildId, prod: v1.buildId, v1: v1.buildId })

    // Each tag runs its own build's result; its sandboxes report the
    // template (not the hidden template of the build) and the tag asked for.
    const sbxs = []
    const seen = async (template) => {
      const sbx = await newSandbox({ template })
      sbxs.push(sbx.sandboxId)
      const info = await sbx.getInfo()
      assert.deepEqual([info.templateId, info.name], [name, template])
      return (await sbx.commands.run('cat /etc/tag-marker')).stdout.trim()
    }
    try {
      assert.equal(await seen(`${name}:v1`), `v1-${RUN_ID}`)
      assert.equal(await seen(`${name}:prod`), `v1-${RUN_ID}`)
      assert.equal(await seen(name), `default-${RUN_ID}`)
      assert.equal(await seen(`${name}:default`), `default-${RUN_ID}`)
      const listed = await Sandbox.list({ query: { template: name } }).nextItems()
      assert.deepEqual(listed.map((s) => s.sandboxId).sort(), [...sbxs].sort())
      assert.ok(listed.every((s) => s.templateId === name), JSON.stringify(listed))

      // assignTags points a tag at the build a name:tag names.
      const assigned = await Template.assignTags(`${name}:v1`, 'stable')
      assert.deepEqual(assigned, { buildId: v1.buildId, tags: ['stable'] })
      assert.equal(await seen(`${name}:stable`), `v1-${RUN_ID}`)
      assert.ok(await Template.exists(`${name}:stable`))
      await Template.removeTags(name, ['prod'])
      assert.deepEqual(await tagMap(), { default: dflt.buildId, stable: v1.buildId, v1: v1.buildId })
      assert.equal(await Template.exists(`${name}:prod`), false)

      // Unknown tags: a clear 404.
      await assert.rejects(newSandbox({ template: `${name}:nope` }), (err) => {
        assert.match(err.message, /^404: .*has no tag "nope" \(its tags: default, stable, v1\)/)
        return true
      })
      await assert.rejects(Template.assignTags(`${name}:nope`, ['x']), /404: .*no tag "nope"/)
      await assert.rejects(Template.removeTags(name, 'nope'), /404: .*no tag nope/)
      await assert.rejects(Template.removeTags(name, 'default'), /400: .*cannot be removed/)
    } finally {
      await Promise.all(sbxs.map(killQuietly))
    }
    const del = await fetch(`${process.env.E2B_API_URL}/templates/${name}`, { method: 'DELETE', headers: { 'X-API-Key': process.env.E2B_API_KEY } })
    assert.equal(del.status, 204, await del.text())
    assert.equal(await Template.exists(name), false)
    assert.equal(await Template.exists(`${name}:v1`), false)
  })

  test('the e2b CLI lists and deletes templates', async () => {
    const env = { ...process.env, NO_UPDATE_NOTIFIER: '1', HOME: tempDir('cube-cli-home-') }
    const cli = (...args) => run(join(import.meta.dirname, 'node_modules', '.bin', 'e2b'), args, { env })
    const name = `${NAME}-cli`
    await Template.build(Template().fromTemplate('base').runCmd(`echo ${RUN_ID} > /etc/cli-marker`, { user: 'root' }), name)
    const { stdout } = await cli('template', 'list', '-f', 'json')
    const listed = JSON.parse(stdout)
    assert.ok(listed.some((t) => t.templateID === name && t.aliases.includes(name)), stdout)
    assert.ok(!listed.some((t) => t.templateID.startsWith('buildcache-')), 'step cache templates are not listed')
    // A template a running sandbox uses is not deleted (its files are the
    // sandbox's root): 409 naming the sandbox, from the API and the CLI.
    const sbx = await Sandbox.create(name, { timeoutMs: 120_000 })
    try {
      const del = await fetch(`${process.env.E2B_API_URL}/templates/${name}`, { method: 'DELETE', headers: { 'X-API-Key': process.env.E2B_API_KEY } })
      const body = await del.text()
      assert.equal(del.status, 409, body)
      assert.match(body, new RegExp(`used by sandboxes .*${sbx.sandboxId}`))
      await assert.rejects(cli('template', 'delete', name, '-y'), /used by sandboxes|409/)
      assert.equal(await Template.exists(name), true)
      assert.equal((await sbx.commands.run('cat /etc/cli-marker')).stdout.trim(), RUN_ID)
    } finally {
      await killQuietly(sbx.sandboxId)
    }
    await cli('template', 'delete', name, '-y')
    assert.equal(await Template.exists(name), false)
    await assert.rejects(cli('template', 'delete', `${name}-nope`, '-y'), /not found/i)
  })

  test('the e2b CLI builds a template from a Dockerfile', async () => {
    const env = { ...process.env, NO_UPDATE_NOTIFIER: '1', HOME: tempDir('cube-cli-home-') }
    const cli = (...args) => run(join(import.meta.dirname, 'node_modules', '.bin', 'e2b'), args, { env })
    const name = `${NAME}-dockerfile`
    const dir = tempDir('cube-tpl-df-')
    writeFileSync(join(dir, 'greeting.txt'), 'copied by the Dockerfile\n')
    writeFileSync(join(dir, 'e2b.Dockerfile'), [
      'FROM e2bdev/base',
      `RUN echo ${RUN_ID} > /etc/df-marker`,
      'COPY greeting.txt /home/user/greeting.txt',
      'ENV DF_VAR=from-dockerfile',
      'WORKDIR /home/user',
      ''
    ].join('\n'))
    const { stdout } = await cli('template', 'create', name, '-p', dir, '-c', 'python3 -m http.server 8000', '--ready-cmd', READY)
    assert.match(stdout, /e2b\.Dockerfile/)
    assert.equal(await Template.exists(name), true)
    const sbx = await Sandbox.create(name, { timeoutMs: 120_000 })
    try {
      const r = await sbx.commands.run('cat /etc/df-marker /home/user/greeting.txt; echo "$DF_VAR"; pwd')
      assert.equal(r.stdout, `${RUN_ID}\ncopied by the Dockerfile\nfrom-dockerfile\n/home/user\n`)
      // The start command (-c) listens: the create waited for the ready command.
      const served = await sbx.commands.run(`bash -c 'exec 3<>/dev/tcp/127.0.0.1/8000 && echo open'`)
      assert.equal(served.stdout.trim(), 'open')
    } finally {
      await killQuietly(sbx.sandboxId)
    }
    await cli('template', 'delete', name, '-y')
  })
})
