/*
 * pyxis_double.c -- TEST DOUBLE for NVIDIA Pyxis (https://github.com/NVIDIA/pyxis).
 *
 * This is NOT Pyxis and runs no containers. Real Pyxis needs enroot, which
 * cannot run on the test machines. This SPANK plugin only registers Pyxis's
 * option names, so real `sbatch` and `srun` accept them (unknown options still
 * fail), and records what it received:
 *   - in the step (remote context) it exports PYXIS_DOUBLE_<OPTION>=<value>,
 *     e.g. --container-image=x -> PYXIS_DOUBLE_CONTAINER_IMAGE=x, flags -> "1";
 *   - in every context it appends one line per option to the log file given
 *     as plugin argument `log=<path>` in plugstack.conf.
 *
 * Build: make -C tests/pyxis_double   (needs spank.h from libslurm-dev)
 * Load:  plugstack.conf line `optional /path/pyxis_double.so log=/path/pyxis_double.log`
 */
#include <ctype.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>
#include <slurm/spank.h>

SPANK_PLUGIN(pyxis_double, 1);

struct opt_def { const char *name; int has_arg; };

static const struct opt_def OPTS[] = {
	{ "container-image", 1 },        { "container-mounts", 1 },
	{ "container-workdir", 1 },      { "container-name", 1 },
	{ "container-env", 1 },          { "container-save", 1 },
	{ "container-writable", 0 },     { "container-readonly", 0 },
	{ "container-mount-home", 0 },   { "no-container-mount-home", 0 },
	{ "container-remap-root", 0 },   { "no-container-remap-root", 0 },
	{ "container-entrypoint", 0 },   { "no-container-entrypoint", 0 },
};
#define NOPTS ((int)(sizeof(OPTS) / sizeof(OPTS[0])))

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

int slurm_spank_init(spank_t sp, int ac, char **av)
{
	for (int i = 0; i < ac; i++)
		if (strncmp(av[i], "log=", 4) == 0)
			snprintf(log_path, sizeof(log_path), "%s", av[i] + 4);
	for (int i = 0; i < NOPTS; i++) {
		struct spank_option o = {
			(char *)OPTS[i].name, OPTS[i].has_arg ? "ARG" : NULL,
			"pyxis test double: recorded, not applied",
			OPTS[i].has_arg, i, record,
		};
		if (spank_option_register(sp, &o) != ESPANK_SUCCESS) {
			slurm_error("pyxis_double: cannot register --%s", OPTS[i].name);
			return -1;
		}
	}
	return 0;
}

static void env_name(const char *opt, char *buf, size_t len)
{
	size_t n = (size_t)snprintf(buf, len, "PYXIS_DOUBLE_%s", opt);
	for (size_t i = 0; i < n && i < len; i++)
		buf[i] = buf[i] == '-' ? '_' : (char)toupper((unsigned char)buf[i]);
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

/* slurmstepd side: export into the step's environment, then log. */
int slurm_spank_user_init(spank_t sp, int ac, char **av)
{
	char name[128];
	(void)ac; (void)av;
	for (int i = 0; i < NOPTS; i++) {
		if (!values[i])
			continue;
		env_name(OPTS[i].name, name, sizeof(name));
		if (spank_setenv(sp, name, values[i], 1) != ESPANK_SUCCESS)
			slurm_error("pyxis_double: cannot set %s", name);
	}
	log_all(sp, "remote");
	return 0;
}
