#!/bin/bash
# Runs inside a test sandbox (TestWorkloadsUnderAllowlist): what agents run
# in sandboxes, offline. Prints "name=ok" or "name=FAIL" per workload, with
# the failing workload's output under "--- name" lines, then "done=ok".
# $1: a scratch directory; node is at /opt/cube-node/node, the test's probe
# at /opt/cube-probe/probe. CUBE_WORKLOADS="python git" runs only those.
set -u
W="$1" SELF="$(realpath "$0")"
export HOME=/root PATH=/opt/cube-node:/usr/local/sbin:/usr/local/bin:/usr/sbin:/usr/bin:/sbin:/bin LC_ALL=C.UTF-8
mkdir -p "$W"
cd "$W" || exit 1

# check NAME FUNCTION runs FUNCTION in a fresh bash (this script with the
# function's name as $2), for at most 3 minutes.
check() {
	local name="$1" out
	if out="$(timeout -k 5 180 bash "$SELF" "$W" "$2" 2>&1)"; then
		echo "$name=ok"
	else
		echo "$name=FAIL"
		echo "--- $name"
		echo "$out" | tail -n 40
		echo "---"
	fi
}

bash_coreutils() (
	set -eo pipefail
	[ "$(seq 1 2000 | sort -rn | sed -n 1,3p | tr '\n' ' ')" = '2000 1999 1998 ' ]
	printf 'b\na\nc\n' >f.txt
	[ "$(sort f.txt | uniq | wc -l)" = 3 ]
	find /usr/bin -maxdepth 1 -name 'ls*' | xargs -n1 basename | grep -x ls >/dev/null
	tar -czf t.tgz f.txt && mkdir -p x && tar -xzf t.tgz -C x && cmp f.txt x/f.txt
	sha256sum f.txt | awk '{print length($1)}' | grep -qx 64
	date -u +%Y >/dev/null
	sleep 0.1
	stat -c %s f.txt | grep -qx 6
	[ "$((6 * 7))" = 42 ]
	cp -a x y && mv y z && rm -r z
	ln -s f.txt l && readlink l | grep -qx f.txt
	df / >/dev/null
	timeout 5 sleep 0.1
	nice -n 5 true
	id -u | grep -qx 0
	while read -r line; do :; done < f.txt
	coproc cat; echo via-coproc >&"${COPROC[1]}"; read -r got <&"${COPROC[0]}"; [ "$got" = via-coproc ]
	kill "$COPROC_PID"
)

python_all() {
	# A file, not stdin: the spawn and forkserver start methods re-import
	# the main module in their children.
	cat >py.py <<'EOF'
import faulthandler; faulthandler.dump_traceback_later(150, exit=True)
import asyncio, multiprocessing as mp, os, subprocess, sys, threading, tempfile, sqlite3, socket, ssl, hashlib
import numpy as np

def sq(x):
    return x * x

def main():
    # multiprocessing: fork and spawn pools, a queue, a shared-memory array.
    for method in ("fork", "spawn", "forkserver"):
        with mp.get_context(method).Pool(2) as p:
            assert p.map(sq, range(10)) == [x * x for x in range(10)], method
    q = mp.Queue(); pr = mp.Process(target=q.put, args=(42,)); pr.start(); assert q.get(timeout=10) == 42; pr.join()
    arr = mp.Array("i", 4); arr[0] = 7; assert arr[0] == 7

    # asyncio: a TCP echo server on loopback, subprocesses, threads.
    async def amain():
        async def echo(r, w):
            w.write(await r.readline()); await w.drain(); w.close()
        srv = await asyncio.start_server(echo, "127.0.0.1", 0)
        port = srv.sockets[0].getsockname()[1]
        r, w = await asyncio.open_connection("127.0.0.1", port)
        w.write(b"hi\n"); await w.drain()
        assert await r.readline() == b"hi\n"
        w.close(); srv.close()
        p = await asyncio.create_subprocess_exec("echo", "sub", stdout=asyncio.subprocess.PIPE)
        out, _ = await p.communicate(); assert out == b"sub\n"
        assert await asyncio.to_thread(sum, [1, 2, 3]) == 6
    asyncio.run(amain())

    # numpy: linear algebra through BLAS threads.
    a = np.random.default_rng(0).random((300, 300))
    assert np.allclose(a @ np.linalg.inv(a), np.eye(300), atol=1e-6)
    assert np.fft.fft(np.ones(8))[0] == 8

    # The rest of the standard library that touches the kernel.
    with sqlite3.connect(os.path.join(tempfile.mkdtemp(), "db")) as c:
        c.execute("create table t(x)"); c.execute("insert into t values (1)")
    assert hashlib.sha256(b"x").hexdigest()
    ssl.create_default_context()
    socket.getaddrinfo("localhost", 80)
    s = socket.socket(socket.AF_INET6); s.close()
    assert subprocess.run(["true"]).returncode == 0
    t = threading.Thread(target=lambda: None); t.start(); t.join()
    os.posix_spawn("/bin/true", ["true"], os.environ)
    print("python ok")

if __name__ == "__main__":  # spawned children import this file
    main()
EOF
	python3 py.py | grep -qx 'python ok'
}

node_all() {
	cat >n.js <<'EOF'
const http = require('http'), fs = require('fs'), cp = require('child_process'), os = require('os');
const { Worker } = require('worker_threads'), crypto = require('crypto'), zlib = require('zlib');
fs.writeFileSync('n.txt', 'x'.repeat(1000));
fs.promises.readFile('n.txt').then(b => { if (b.length !== 1000) throw new Error('read'); });
if (cp.execSync('echo child').toString() !== 'child\n') throw new Error('exec');
if (zlib.gunzipSync(zlib.gzipSync('z')).toString() !== 'z') throw new Error('zlib');
crypto.createHash('sha256').update('x').digest('hex'); crypto.randomBytes(16); os.cpus();
const w = new Worker('require("worker_threads").parentPort.postMessage(6*7)', { eval: true });
w.on('message', m => { if (m !== 42) throw new Error('worker'); });
const srv = http.createServer((req, res) => res.end('pong')).listen(0, '127.0.0.1', () => {
  http.get({ host: '127.0.0.1', port: srv.address().port }, res => {
    let body = ''; res.on('data', d => body += d);
    res.on('end', () => { if (body !== 'pong') throw new Error('http'); srv.close(); console.log('node ok'); });
  });
});
EOF
	node n.js | grep -qx 'node ok'
}

dpkg_local() {
	mkdir -p pkg/DEBIAN pkg/opt/cube-hello &&
		printf 'Package: cube-hello\nVersion: 1.0\nArchitecture: all\nMaintainer: t <t@t>\nDescription: test\n' >pkg/DEBIAN/control &&
		printf '#!/bin/sh\necho installed >/opt/cube-hello/postinst-ran\n' >pkg/DEBIAN/postinst && chmod 755 pkg/DEBIAN/postinst &&
		printf '#!/bin/sh\necho hello-deb\n' >pkg/opt/cube-hello/hello && chmod 755 pkg/opt/cube-hello/hello &&
		dpkg-deb --root-owner-group --build pkg cube-hello.deb >/dev/null &&
		dpkg -i cube-hello.deb && /opt/cube-hello/hello | grep -qx hello-deb &&
		grep -qx installed /opt/cube-hello/postinst-ran && dpkg -s cube-hello | grep -q 'Status: install ok installed' &&
		dpkg -r cube-hello && [ ! -e /opt/cube-hello/hello ] &&
		apt-get install -y -q "$PWD/cube-hello.deb" && /opt/cube-hello/hello | grep -qx hello-deb
}

pip_wheel() {
	python3 - <<'EOF' &&
import zipfile, hashlib, base64
files = {"cubewheel/__init__.py": "VALUE = 42\n",
         "cubewheel-1.0.dist-info/METADATA": "Metadata-Version: 2.1\nName: cubewheel\nVersion: 1.0\n",
         "cubewheel-1.0.dist-info/WHEEL": "Wheel-Version: 1.0\nGenerator: test\nRoot-Is-Purelib: true\nTag: py3-none-any\n"}
rec = []
for n, d in files.items():
    h = base64.urlsafe_b64encode(hashlib.sha256(d.encode()).digest()).rstrip(b"=").decode()
    rec.append(f"{n},sha256={h},{len(d)}")
rec.append("cubewheel-1.0.dist-info/RECORD,,")
files["cubewheel-1.0.dist-info/RECORD"] = "\n".join(rec) + "\n"
with zipfile.ZipFile("cubewheel-1.0-py3-none-any.whl", "w") as z:
    for n, d in files.items():
        z.writestr(n, d)
EOF
		python3 -m pip install --no-index --no-cache-dir --user --break-system-packages cubewheel-1.0-py3-none-any.whl &&
		python3 -c 'import cubewheel; assert cubewheel.VALUE == 42'
}

gcc_c() {
	cat >c.c <<'EOF'
#include <pthread.h>
#include <stdio.h>
#include <stdlib.h>
#include <sys/wait.h>
#include <unistd.h>
static void *run(void *p) { *(int *)p = 42; return NULL; }
int main(void) {
	int v = 0; pthread_t t;
	if (pthread_create(&t, NULL, run, &v) || pthread_join(t, NULL) || v != 42) return 1;
	pid_t pid = fork();
	if (pid == 0) _exit(7);
	int st; waitpid(pid, &st, 0);
	if (!WIFEXITED(st) || WEXITSTATUS(st) != 7) return 2;
	if (system("true") != 0) return 3;
	char *m = malloc(1 << 24); m[1 << 23] = 1; free(m);
	printf("c ok\n");
	return 0;
}
EOF
	gcc -O2 -pthread -o c c.c && ./c | grep -qx 'c ok'
}

git_local() {
	git init -q -b main repo && cd repo &&
		git config user.email t@t && git config user.name t &&
		echo one >a && git add a && git commit -qm one &&
		git checkout -qb feature && echo two >>a && git commit -qam two &&
		git checkout -q main && git merge -q --no-edit feature &&
		[ "$(git log --oneline | wc -l)" = 2 ] && git status --porcelain | wc -l | grep -qx 0 &&
		git gc -q && git clone -q . ../clone && [ -f ../clone/a ] && git grep -q two
}

jupyter_kernel() {
	timeout 120 python3 - <<'EOF'
from jupyter_client.manager import start_new_kernel
km, kc = start_new_kernel(kernel_name="python3", startup_timeout=60)
try:
    out = []
    reply = kc.execute_interactive("import numpy as np; print(int(np.arange(10).sum()))", timeout=60,
                                   output_hook=lambda m: out.append(m))
    assert reply["content"]["status"] == "ok", reply
    text = "".join(m["content"].get("text", "") for m in out if m["msg_type"] == "stream")
    assert text.strip() == "45", out
finally:
    kc.stop_channels(); km.shutdown_kernel(now=True)
print("kernel ok")
EOF
}

if [ $# -ge 2 ]; then
	"$2"
	exit
fi
ONLY="${CUBE_WORKLOADS:-}"
for w in bash_coreutils:bash_coreutils python:python_all node:node_all dpkg:dpkg_local pip_wheel:pip_wheel \
	gcc:gcc_c git:git_local jupyter:jupyter_kernel; do
	if [ -z "$ONLY" ] || [[ " $ONLY " == *" ${w%%:*} "* ]]; then
		check "${w%%:*}" "${w#*:}"
	fi
done
# A refused call the seccomp log must attribute to this sandbox.
/opt/cube-probe/probe refuse
echo done=ok
