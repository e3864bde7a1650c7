/*
 * cube-nsexec is the first process of a user-namespaced sandbox's workload
 * (B in internal/nsrt/userns.go), in C so that it costs neither a Go
 * runtime start nor a full fork of pid 1 per create.
 *
 * sandbox-init (pid 1 of the sandbox, host root) starts it with a plain
 * vfork + exec, fd 3 = the ready fd (passed on to the workload), fd 4 = a
 * stream socket to pid 1. Then, on that socket:
 *
 *   1. it unshares a user namespace and writes 'u';
 *   2. pid 1 writes its uid_map and gid_map (setgroups stays "allow": envd
 *      runs commands with supplementary groups) and writes 'm';
 *   3. it becomes root of the namespace (setgroups(0), setresgid/setresuid
 *      0: the mapped host id) and waits; pid 1 builds the root filesystem,
 *      pivots (which moves this process's root and cwd too) and sends the
 *      exec request (below), then closes the socket;
 *   4. it roots a cgroup namespace where it is (the sandbox cgroup), keeps
 *      only the requested capabilities (bounding, effective and permitted
 *      sets; ambient and inheritable cleared), sets no_new_privs, installs
 *      the seccomp filters and execs the workload.
 *
 * EOF before a step means pid 1 gave up: it exits 1 without a word. Every
 * other failure is one line on stderr (the sandbox's init log) and exit 1.
 *
 * The exec request, native byte order (pid 1 and this binary run on the
 * same machine):
 *
 *   "CUBENSX1"                magic and protocol version
 *   u64 keep                  capability mask to keep
 *   u32 nfilters, then per filter: u32 flags (1 = log), u32 n, n x 8 bytes
 *   str path                  u32 length + bytes (no NUL)
 *   u32 nargs, nargs x str    argv
 *   u32 nenv,  nenv x str     envp
 *
 * Built by `make build` with gcc -static next to cube-shim; without it
 * sandbox-init runs B as a second Go process (nsrt.usernsChildMain).
 */
#define _GNU_SOURCE
#include <errno.h>
#include <grp.h>
#include <linux/capability.h>
#include <linux/filter.h>
#include <linux/seccomp.h>
#include <sched.h>
#include <stdarg.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/prctl.h>
#include <sys/syscall.h>
#include <unistd.h>

#define SYNC_FD 4
#define MAGIC "CUBENSX1"
#define MAX_REQUEST (16 << 20)
#define MAX_FILTERS 8
#define MAX_INSNS 4096

static void die(const char *fmt, ...) {
	char msg[512];
	va_list ap;
	va_start(ap, fmt);
	vsnprintf(msg, sizeof msg, fmt, ap);
	va_end(ap);
	fprintf(stderr, "sandbox-init: workload: %s\n", msg);
	_exit(1);
}

static void die_errno(const char *what) { die("%s: %s", what, strerror(errno)); }

/* request is the exec request being parsed. */
struct request {
	const unsigned char *p, *end;
};

static void need(struct request *r, size_t n) {
	if ((size_t)(r->end - r->p) < n)
		die("exec request: truncated");
}

/* take copies the next n bytes to dst. */
static void take(struct request *r, void *dst, size_t n) {
	need(r, n);
	memcpy(dst, r->p, n);
	r->p += n;
}

static uint32_t u32(struct request *r) {
	uint32_t v;
	take(r, &v, sizeof v);
	return v;
}

static uint64_t u64(struct request *r) {
	uint64_t v;
	take(r, &v, sizeof v);
	return v;
}

/* str returns a NUL-terminated copy of the next string. */
static char *str(struct request *r) {
	uint32_t n = u32(r);
	need(r, n);
	if (memchr(r->p, 0, n))
		die("exec request: a string holds a NUL byte");
	char *s = malloc((size_t)n + 1);
	if (!s)
		die("exec request: out of memory");
	take(r, s, n);
	s[n] = 0;
	return s;
}

/* strs returns the next NULL-terminated string list. */
static char **strs(struct request *r) {
	uint32_t n = u32(r);
	if (n > (uint32_t)(r->end - r->p) / 4) /* each takes at least its length */
		die("exec request: %u strings do not fit", n);
	char **v = calloc((size_t)n + 1, sizeof *v);
	if (!v)
		die("exec request: out of memory");
	for (uint32_t i = 0; i < n; i++)
		v[i] = str(r);
	return v;
}

struct filter {
	struct sock_fprog prog;
	unsigned int flags;
};

/* read_all reads fd until EOF into a new buffer; *len is its size. */
static unsigned char *read_all(int fd, size_t *len) {
	size_t cap = 64 << 10, n = 0;
	unsigned char *b = malloc(cap);
	if (!b)
		die("exec request: out of memory");
	for (;;) {
		if (n == cap) {
			if (cap >= MAX_REQUEST)
				die("exec request: larger than %d bytes", MAX_REQUEST);
			cap *= 2;
			if (!(b = realloc(b, cap)))
				die("exec request: out of memory");
		}
		ssize_t k = read(fd, b + n, cap - n);
		if (k < 0 && errno == EINTR)
			continue;
		if (k < 0)
			die_errno("read the exec request");
		if (k == 0)
			break;
		n += (size_t)k;
	}
	*len = n;
	return b;
}

/* harden keeps the capabilities in keep only and installs the filters. */
static void harden(uint64_t keep, struct filter *fs, uint32_t nfs) {
	for (unsigned long c = 0; c < 64; c++) {
		if (keep & (1ULL << c))
			continue;
		if (prctl(PR_CAPBSET_DROP, c, 0, 0, 0) < 0) {
			if (errno == EINVAL)
				break; /* past the kernel's last capability */
			die("drop capability %lu from the bounding set: %s", c, strerror(errno));
		}
	}
	if (prctl(PR_CAP_AMBIENT, PR_CAP_AMBIENT_CLEAR_ALL, 0, 0, 0) < 0)
		die_errno("clear ambient capabilities");
	struct __user_cap_header_struct hdr = {.version = _LINUX_CAPABILITY_VERSION_3};
	struct __user_cap_data_struct data[2] = {0};
	for (int i = 0; i < 2; i++) {
		data[i].effective = (uint32_t)(keep >> (32 * i));
		data[i].permitted = (uint32_t)(keep >> (32 * i));
	}
	if (syscall(SYS_capset, &hdr, data) < 0)
		die_errno("set capabilities");
	if (prctl(PR_SET_NO_NEW_PRIVS, 1, 0, 0, 0) < 0)
		die_errno("set no_new_privs");
	for (uint32_t i = 0; i < nfs; i++) {
		unsigned int flags = SECCOMP_FILTER_FLAG_TSYNC;
		if (fs[i].flags & 1)
			flags |= SECCOMP_FILTER_FLAG_LOG;
		if (syscall(SYS_seccomp, SECCOMP_SET_MODE_FILTER, flags, &fs[i].prog) != 0)
			die_errno("seccomp: install filter");
	}
}

/* await reads one byte from pid 1; EOF (pid 1 gave up) ends the process. */
static void await(char want) {
	char c;
	ssize_t k;
	while ((k = read(SYNC_FD, &c, 1)) < 0 && errno == EINTR)
		;
	if (k < 0)
		die_errno("wait for pid 1");
	if (k == 0)
		_exit(1);
	if (c != want)
		die("pid 1 sent %#x, expected '%c'", (unsigned char)c, want);
}

int main(void) {
	if (unshare(CLONE_NEWUSER) < 0)
		die_errno("unshare(CLONE_NEWUSER)");
	if (write(SYNC_FD, "u", 1) != 1)
		die_errno("tell pid 1 the user namespace is made");
	await('m');
	if (setgroups(0, NULL) < 0)
		die_errno("setgroups");
	if (setresgid(0, 0, 0) < 0)
		die_errno("setresgid 0");
	if (setresuid(0, 0, 0) < 0)
		die_errno("setresuid 0");

	size_t len;
	unsigned char *buf = read_all(SYNC_FD, &len);
	close(SYNC_FD);
	if (len == 0)
		_exit(1); /* pid 1 aborted the start */
	struct request r = {buf, buf + len};
	need(&r, strlen(MAGIC));
	if (memcmp(r.p, MAGIC, strlen(MAGIC)) != 0)
		die("exec request: not protocol %s (cube-nsexec and cube-shim of different versions?)", MAGIC);
	r.p += strlen(MAGIC);
	uint64_t keep = u64(&r);
	uint32_t nfs = u32(&r);
	if (nfs > MAX_FILTERS)
		die("exec request: %u seccomp filters", nfs);
	struct filter fs[MAX_FILTERS];
	for (uint32_t i = 0; i < nfs; i++) {
		fs[i].flags = u32(&r);
		uint32_t n = u32(&r);
		if (n == 0 || n > MAX_INSNS)
			die("exec request: seccomp filter of %u instructions", n);
		need(&r, (size_t)n * sizeof(struct sock_filter));
		struct sock_filter *insns = malloc((size_t)n * sizeof *insns);
		if (!insns)
			die("exec request: out of memory");
		take(&r, insns, (size_t)n * sizeof *insns);
		fs[i].prog.len = (unsigned short)n;
		fs[i].prog.filter = insns;
	}
	char *path = str(&r);
	char **argv = strs(&r);
	char **envp = strs(&r);
	if (r.p != r.end)
		die("exec request: %zu bytes left over", (size_t)(r.end - r.p));
	if (!argv[0])
		die("exec request: no argv");

	if (chdir("/") < 0)
		die_errno("chdir /");
	/* In the sandbox cgroup (born there, or moved by pid 1): root the
	 * namespace there. */
	if (unshare(CLONE_NEWCGROUP) < 0)
		fprintf(stderr, "sandbox-init: workload: no cgroup namespace: %s\n", strerror(errno));
	harden(keep, fs, nfs);
	execve(path, argv, envp);
	die("exec %s: %s", path, strerror(errno));
}
