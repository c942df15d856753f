/*
 * pyxis_double.c -- TEST DOUBLE for NVIDIA Pyxis (https://github.com/NVIDIA/pyxis).
 *
 * This is NOT Pyxis and runs no image. Real Pyxis needs enroot, which cannot
 * run on the test machines. This SPANK plugin registers Pyxis's option names,
 * so real `sbatch` and `srun` accept them (unknown options still fail), and
 * makes a step with --container-image (or --container-name) look, from the
 * inside, like a Pyxis + enroot step as far as that is possible without a
 * container root filesystem. What it imitates, and from which source:
 *
 *   - a private mount namespace per task (enroot-nsenter --mount), slave
 *     propagation like enroot's rootfs mounts;
 *   - --container-mounts=SRC:DST[:FLAGS],...: SRC (absolute, ./relative,
 *     or "tmpfs") is rbind-mounted at DST, "ro" remounts it read-only, "umount"
 *     detaches DST (Pyxis args.c add_mount, enroot-mount);
 *   - --container-mount-home: $HOME is bind-mounted at $HOME, or at /root with
 *     --container-remap-root, which also sets HOME=/root (enroot 10-home.sh);
 *   - --container-readonly: / is remounted read-only (enroot runtime.sh does
 *     that unless ENROOT_ROOTFS_WRITABLE); /tmp stays writable like enroot's
 *     tmpfs /tmp, by a bind of the host's /tmp. Without the flag / stays
 *     writable: a site whose enroot.conf sets ENROOT_ROOTFS_WRITABLE=yes;
 *   - the working directory is --container-workdir, else / (an image without
 *     a WorkingDir; Pyxis chdir()s to the container's cwd, not the job's);
 *   - LANG, LANGUAGE and LC_ALL are removed from the task environment unless
 *     named in --container-env (Pyxis container_deny_env);
 *   - --container-remap-root: uid 0 inside. Only a root job can have that
 *     here (no user namespace); for any other user the task fails.
 *
 * What it cannot imitate: the image's root filesystem, so there is no /.lock
 * (enroot's container marker) and no pyxis_<name> container directory. In its
 * place it sets SLURMRL_PYXIS_TEST_DOUBLE in the task environment, a name real
 * Pyxis never sets; slurmrl's preflight skips exactly those two checks when it
 * sees it. It also appends one line per option to the log file given as plugin
 * argument `log=<path>` in plugstack.conf, in every context.
 * A DST that does not exist fails the task: creating it would write to the
 * host's root filesystem (enroot creates it inside the container's rootfs).
 *
 * Build: make -C tests/pyxis_double   (needs spank.h from libslurm-dev)
 * Load:  plugstack.conf line `required /path/pyxis_double.so log=/path/pyxis_double.log`
 *        (`required` as Pyxis installs itself: a failed container setup fails the task)
 * The local cluster (slurmrl/localcluster/cluster.sh up) rebuilds it whenever
 * this file changes; slurmstepd loads it anew for every step.
 */
#define _GNU_SOURCE
#include <errno.h>
#include <fcntl.h>
#include <limits.h>
#include <sched.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/mount.h>
#include <sys/stat.h>
#include <sys/statvfs.h>
#include <unistd.h>
#include <slurm/spank.h>

SPANK_PLUGIN(pyxis_double, 1);

#define MARKER_ENV "SLURMRL_PYXIS_TEST_DOUBLE"
#define MARKER_VALUE "tests/pyxis_double: Pyxis options applied without an image"

enum {
	IMAGE, MOUNTS, WORKDIR, NAME, ENV, SAVE, UNSHARE,
	WRITABLE, READONLY, MOUNT_HOME, NO_MOUNT_HOME, REMAP_ROOT, NO_REMAP_ROOT,
	ENTRYPOINT, NO_ENTRYPOINT, ENTRYPOINT_LOG, NOPTS
};

struct opt_def { const char *name; int has_arg; };

static const struct opt_def OPTS[NOPTS] = {
	[IMAGE] = { "container-image", 1 },          [MOUNTS] = { "container-mounts", 1 },
	[WORKDIR] = { "container-workdir", 1 },      [NAME] = { "container-name", 1 },
	[ENV] = { "container-env", 1 },              [SAVE] = { "container-save", 1 },
	[UNSHARE] = { "container-unshare", 1 },
	[WRITABLE] = { "container-writable", 0 },    [READONLY] = { "container-readonly", 0 },
	[MOUNT_HOME] = { "container-mount-home", 0 }, [NO_MOUNT_HOME] = { "no-container-mount-home", 0 },
	[REMAP_ROOT] = { "container-remap-root", 0 }, [NO_REMAP_ROOT] = { "no-container-remap-root", 0 },
	[ENTRYPOINT] = { "container-entrypoint", 0 }, [NO_ENTRYPOINT] = { "no-container-entrypoint", 0 },
	[ENTRYPOINT_LOG] = { "container-entrypoint-log", 0 },
};

static char *values[NOPTS];      /* what each option received (NULL: unused) */
static char log_path[4096];

static int record(int val, const char *optarg, int remote)
{
	(void)remote;
	if (val < 0 || val >= NOPTS)
		return -1;
	free(values[val]);
	/* flags get "1" (slurmstepd passes them an empty optarg) */
	values[val] = strdup(OPTS[val].has_arg && optarg ? optarg : "1");
	return 0;
}

/* Pyxis runs a container when an image or a container name is given. */
static int enabled(void)
{
	return values[IMAGE] != NULL || values[NAME] != NULL;
}

int slurm_spank_init(spank_t sp, int ac, char **av)
{
	for (int i = 0; i < ac; i++)
		if (strncmp(av[i], "log=", 4) == 0)
			snprintf(log_path, sizeof(log_path), "%s", av[i] + 4);
	for (int i = 0; i < NOPTS; i++) {
		struct spank_option o = {
			(char *)OPTS[i].name, OPTS[i].has_arg ? "ARG" : NULL,
			"pyxis test double (tests/pyxis_double): applied without an image",
			OPTS[i].has_arg, i, record,
		};
		if (spank_option_register(sp, &o) != ESPANK_SUCCESS) {
			slurm_error("pyxis_double: cannot register --%s", OPTS[i].name);
			return -1;
		}
	}
	return 0;
}

static void log_all(spank_t sp, const char *ctx)
{
	uint32_t job = 0, step = 0;
	char host[256] = "?";
	FILE *f;

	if (!log_path[0])
		return;
	if (spank_remote(sp) == 1) {
		spank_get_item(sp, S_JOB_ID, &job);
		spank_get_item(sp, S_JOB_STEPID, &step);
	}
	gethostname(host, sizeof(host) - 1);
	for (int i = 0; i < NOPTS; i++) {
		if (!values[i] || !(f = fopen(log_path, "a")))
			continue;
		fprintf(f, "ctx=%s host=%s job=%u step=%u --%s=%s\n",
			ctx, host, job, step, OPTS[i].name, values[i]);
		fclose(f);
	}
}

/* srun / sbatch / salloc side, after option parsing. */
int slurm_spank_init_post_opt(spank_t sp, int ac, char **av)
{
	(void)ac; (void)av;
	switch (spank_context()) {
	case S_CTX_LOCAL: log_all(sp, "local"); break;
	case S_CTX_ALLOCATOR: log_all(sp, "allocator"); break;
	default: break;
	}
	return 0;
}

/* Is NAME in the comma-separated --container-env list? */
static int env_listed(const char *name)
{
	const char *p = values[ENV];
	size_t n = strlen(name);

	while (p && *p) {
		size_t len = strcspn(p, ",");
		if (len == n && strncmp(p, name, n) == 0)
			return 1;
		p += len + (p[len] == ',');
	}
	return 0;
}

/* slurmstepd side, once per step: the environment the container's tasks get. */
int slurm_spank_user_init(spank_t sp, int ac, char **av)
{
	static const char *deny[] = { "LANG", "LANGUAGE", "LC_ALL" };

	(void)ac; (void)av;
	log_all(sp, "remote");
	if (!enabled())
		return 0;
	for (size_t i = 0; i < sizeof(deny) / sizeof(deny[0]); i++)
		if (!env_listed(deny[i]))
			spank_unsetenv(sp, deny[i]);
	if (values[REMAP_ROOT] && values[MOUNT_HOME])
		spank_setenv(sp, "HOME", "/root", 1);
	if (spank_setenv(sp, MARKER_ENV, MARKER_VALUE, 1) != ESPANK_SUCCESS) {
		slurm_error("pyxis_double: cannot set %s", MARKER_ENV);
		return -1;
	}
	return 0;
}

static int fail(const char *what, const char *path)
{
	slurm_error("pyxis_double: %s %s: %s", what, path, strerror(errno));
	return -1;
}

/* Per-mount flags of PATH that a bind remount must keep. */
static unsigned long kept_flags(const char *path)
{
	struct statvfs sv;
	unsigned long fl = 0;

	if (statvfs(path, &sv) < 0)
		return 0;
	if (sv.f_flag & ST_NOSUID) fl |= MS_NOSUID;
	if (sv.f_flag & ST_NODEV) fl |= MS_NODEV;
	if (sv.f_flag & ST_NOEXEC) fl |= MS_NOEXEC;
	if (sv.f_flag & ST_NOATIME) fl |= MS_NOATIME;
	if (sv.f_flag & ST_NODIRATIME) fl |= MS_NODIRATIME;
	if (sv.f_flag & ST_RELATIME) fl |= MS_RELATIME;
	return fl;
}

static int remount_ro(const char *path)
{
	if (mount(NULL, path, NULL, MS_REMOUNT | MS_BIND | MS_RDONLY | kept_flags(path), NULL) < 0)
		return fail("cannot remount read-only", path);
	return 0;
}

/* One --container-mounts entry, SRC[:DST[:FLAGS]] with FLAGS joined by "+". */
static int mount_entry(char *entry)
{
	char *src = strsep(&entry, ":");
	char *dst = entry ? strsep(&entry, ":") : NULL;
	char *flags = entry, *flag;
	char target[PATH_MAX], source[PATH_MAX];
	int ro = 0;

	if (!src || !*src)
		return -1;
	if (!dst || !*dst)
		dst = src;
	/* DST is inside the container's root: relative means under / */
	snprintf(target, sizeof(target), "%s%s", dst[0] == '/' ? "" : "/", dst);
	while (flags && (flag = strsep(&flags, "+")) != NULL)
		ro |= strcmp(flag, "ro") == 0;

	if (strcmp(src, "umount") == 0)
		return umount2(target, MNT_DETACH) < 0 ? fail("cannot detach", target) : 0;
	if (access(target, F_OK) < 0)
		return fail("mount target does not exist on the host (the double cannot create it):", target);
	if (strcmp(src, "tmpfs") == 0) {
		if (mount("tmpfs", target, "tmpfs", MS_NOSUID | MS_NODEV, "mode=755") < 0)
			return fail("cannot mount tmpfs at", target);
	} else {
		if (!realpath(src, source))
			return fail("mount source", src);
		if (mount(source, target, NULL, MS_BIND | MS_REC, NULL) < 0)
			return fail("cannot bind-mount at", target);
	}
	return ro ? remount_ro(target) : 0;
}

/* Each task, as root, before it becomes the job's user: its own mount namespace. */
int slurm_spank_task_init_privileged(spank_t sp, int ac, char **av)
{
	char home[PATH_MAX] = "";
	char *list, *p, *entry;
	uid_t uid = (uid_t)-1;
	int rv = 0;

	(void)ac; (void)av;
	if (!enabled())
		return 0;
	spank_get_item(sp, S_JOB_UID, &uid);
	if (values[REMAP_ROOT] && uid != 0) {
		slurm_error("pyxis_double: --container-remap-root needs a user namespace; "
			    "the test double runs it for root jobs only (uid %u)", (unsigned)uid);
		return -1;
	}
	if (unshare(CLONE_NEWNS) < 0)
		return fail("cannot unshare the mount namespace", "");
	if (mount(NULL, "/", NULL, MS_REC | MS_SLAVE, NULL) < 0)
		return fail("cannot make mounts slave under", "/");
	if (values[READONLY] && mount("/tmp", "/tmp", NULL, MS_BIND | MS_REC, NULL) < 0)
		return fail("cannot keep writable", "/tmp");
	if (values[MOUNTS]) {
		if (!(list = p = strdup(values[MOUNTS])))
			return -1;
		while (rv == 0 && (entry = strsep(&p, ",")) != NULL)
			rv = mount_entry(entry);
		free(list);
		if (rv < 0)
			return -1;
	}
	if (values[MOUNT_HOME]) {
		if (spank_getenv(sp, "HOME", home, sizeof(home)) != ESPANK_SUCCESS || !home[0])
			snprintf(home, sizeof(home), "/root");
		/* enroot binds it at /root with remap-root: here only root jobs get that, HOME=/root */
		if (mount(home, home, NULL, MS_BIND | MS_REC, NULL) < 0)
			return fail("cannot bind-mount home", home);
	}
	if (values[READONLY] && remount_ro("/") < 0)
		return -1;
	return 0;
}

/* Each task, as the job's user, just before exec: Pyxis chdir()s here too. */
int slurm_spank_task_init(spank_t sp, int ac, char **av)
{
	const char *dir = values[WORKDIR] ? values[WORKDIR] : "/";

	(void)sp; (void)ac; (void)av;
	if (!enabled())
		return 0;
	if (chdir(dir) < 0)
		return fail("cannot chdir to", dir);
	return 0;
}
