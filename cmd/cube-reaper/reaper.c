/*
 * cube-reaper is pid 1 of a sandbox: it starts envd (or, in a user
 * namespace, adopts the envd the runtime started), reaps every orphan the
 * kernel hands it in a blocking wait4 and exits with envd's status (128+N
 * when envd was killed by signal N).
 *
 *   cube-reaper [--inherit-fd N] -- ARGV...   start ARGV (passing fd N on) and reap
 *   CUBE_REAP_PID=PID cube-reaper            reap until PID (a child) exits
 *
 * It is C, static (gcc), so that pid 1 costs a sandbox one thread and a few
 * pages instead of a Go runtime (~3.5 threads, ~0.5 MiB anon), and a create
 * no Go runtime start. envd can still reap for itself when it is pid 1
 * (internal/envd/reaper), for runtimes that start it directly; the two
 * behave alike (TestReaper in internal/nativebin).
 *
 * Signals: a termination signal (SIGTERM, SIGINT, SIGHUP, SIGQUIT) ends it
 * with 128+N, and with it the sandbox's pid namespace, as the Go reaper's
 * runtime did; pid 1 of a namespace gets only signals it handles, so the
 * handlers are what lets them through. Cube itself sends pid 1 only SIGKILL.
 */
#define _GNU_SOURCE
#include <errno.h>
#include <fcntl.h>
#include <signal.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/syscall.h>
#include <sys/wait.h>
#include <unistd.h>

/* Tells envd it was started by a reaper (internal/envd/reaper envMarker). */
#define ENV_MARKER "CUBE_ENVD_REAPED=1"
#define ADOPT_ENV "CUBE_REAP_PID"

extern char **environ;

static void usage(void) {
	fputs("usage: cube-reaper [--inherit-fd N] -- ARGV... (or CUBE_REAP_PID=PID cube-reaper)\n", stderr);
	exit(2);
}

static void on_term(int sig) { _exit(128 + sig); }

/* reap_until collects every child that exits until main is among them and
 * returns the exit code for main's end. */
static int reap_until(pid_t main_pid) {
	for (;;) {
		int ws;
		pid_t pid = waitpid(-1, &ws, 0);
		if (pid < 0 && errno == EINTR)
			continue;
		if (pid < 0) {
			fprintf(stderr, "cube-reaper: wait for %d: %s\n", (int)main_pid, strerror(errno));
			return 1;
		}
		if (pid != main_pid)
			continue;
		if (WIFEXITED(ws))
			return WEXITSTATUS(ws);
		if (WIFSIGNALED(ws))
			return 128 + WTERMSIG(ws);
		return 1;
	}
}

/* parse_fd reads N of --inherit-fd N: a number above 2. */
static int parse_fd(const char *s) {
	char *end;
	errno = 0;
	long n = strtol(s, &end, 10);
	if (errno || end == s || *end || n < 3 || n > 1 << 20)
		usage();
	return (int)n;
}

/* child_env is environ plus ENV_MARKER. */
static char **child_env(void) {
	size_t n = 0;
	while (environ[n])
		n++;
	char **env = calloc(n + 2, sizeof *env);
	if (!env) {
		fputs("cube-reaper: out of memory\n", stderr);
		exit(1);
	}
	memcpy(env, environ, n * sizeof *env);
	env[n] = ENV_MARKER;
	return env;
}

/* close_range closes fds lo..hi (the syscall: older libcs lack the
 * wrapper; a loop where the kernel lacks it). */
static void close_fds(unsigned int lo, unsigned int hi) {
	if (lo > hi)
		return;
	if (syscall(SYS_close_range, lo, hi, 0) != 0)
		for (unsigned int fd = lo; fd <= hi && fd < 4096; fd++)
			close((int)fd);
}

/* close_fds_except closes every fd above 2 but keep (-1: none) and the
 * close-on-exec fd errfd, which the exec closes. */
static void close_fds_except(int keep, int errfd) {
	int a = keep, b = errfd; /* a < b: the two fds to skip */
	if (a < 0 || a > b) {
		a = errfd;
		b = keep;
	}
	if (b < 0) { /* only errfd */
		close_fds(3, (unsigned int)a - 1);
		close_fds((unsigned int)a + 1, ~0U);
		return;
	}
	close_fds(3, (unsigned int)a - 1);
	close_fds((unsigned int)a + 1, (unsigned int)b - 1);
	close_fds((unsigned int)b + 1, ~0U);
}

int main(int argc, char **argv) {
	struct sigaction sa = {.sa_handler = on_term};
	sigemptyset(&sa.sa_mask);
	int sigs[] = {SIGTERM, SIGINT, SIGHUP, SIGQUIT};
	for (size_t i = 0; i < sizeof sigs / sizeof *sigs; i++)
		sigaction(sigs[i], &sa, NULL);

	const char *adopt = getenv(ADOPT_ENV);
	if (adopt) {
		char *end;
		long pid = strtol(adopt, &end, 10);
		if (end != adopt && !*end && pid > 1)
			return reap_until((pid_t)pid);
	}
	int inherit = -1, i = 1;
	for (; i < argc; i++) {
		if (!strcmp(argv[i], "--")) {
			i++;
			break;
		}
		if (strcmp(argv[i], "--inherit-fd") || i + 1 >= argc)
			usage();
		inherit = parse_fd(argv[++i]);
	}
	if (i >= argc || (i > 0 && strcmp(argv[i - 1], "--")))
		usage();
	char **env = child_env();
	/* The child's exec error comes back on a close-on-exec pipe, so a
	 * program that cannot start is reported like a failed fork. */
	int errp[2];
	if (pipe2(errp, O_CLOEXEC) < 0) {
		fprintf(stderr, "cube-reaper: pipe: %s\n", strerror(errno));
		return 1;
	}
	pid_t pid = fork();
	if (pid < 0) {
		fprintf(stderr, "cube-reaper: start %s: %s\n", argv[i], strerror(errno));
		return 1;
	}
	if (pid == 0) {
		if (errp[1] < 3 || (inherit >= 0 && errp[1] == inherit))
			_exit(127); /* cannot happen: 0-2 and the inherited fd are open */
		close_fds_except(inherit, errp[1]);
		struct sigaction dfl = {.sa_handler = SIG_DFL};
		sigemptyset(&dfl.sa_mask);
		for (size_t k = 0; k < sizeof sigs / sizeof *sigs; k++)
			sigaction(sigs[k], &dfl, NULL);
		execve(argv[i], argv + i, env);
		int e = errno;
		if (write(errp[1], &e, sizeof e) < 0)
			_exit(127);
		_exit(127);
	}
	close(errp[1]);
	if (inherit >= 0)
		close(inherit); /* only the child holds it (a ready pipe's EOF) */
	int e;
	ssize_t k;
	while ((k = read(errp[0], &e, sizeof e)) < 0 && errno == EINTR)
		;
	close(errp[0]);
	if (k == sizeof e) {
		waitpid(pid, NULL, 0);
		fprintf(stderr, "cube-reaper: start %s: %s\n", argv[i], strerror(e));
		return 1;
	}
	return reap_until(pid);
}
