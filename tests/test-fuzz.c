/* SPDX-License-Identifier: MIT
 *
 * tests/test-fuzz.c: the mutation fuzzer of issue 24, kept in the suite.
 * Every parser is fed mutations of real inputs from a fixed seed: HF
 * config.json files (tests/data/hf), cluster files (tests/data/cluster),
 * plan files (tests/data/golden/ *.plan.json), the numeric flags of the
 * planning commands, and the JSON API's queries and bodies (stowage serve,
 * its requests answered in this process as its workers answer them).  Each case
 * runs the stowage command that reads it in a forked child of this process (the
 * commands are a library, cli/, so a case costs a fork, not an exec and a
 * catalog load) and fails on a crash (a signal, a sanitizer report), a hang, an
 * exit status other than 0, 1 or 2, "nan" or "inf" in the output, or JSON
 * output that does not parse.
 *
 * STOW_FUZZ_CASES=N runs N cases per parser (default 2000, in the normal
 * and the ASan run alike), STOW_FUZZ_SEED another seed; bench/fuzz.sh
 * runs the long mode.  A failure prints the seed, the case number, the
 * command and the input, which reproduce it.
 */
#include <errno.h>
#include <glib/gstdio.h>
#include <locale.h>
#include <math.h>
#include <signal.h>
#include <stdio.h>
#include <string.h>
#include <sys/mman.h>
#include <sys/wait.h>
#include <unistd.h>

#include "cli/api.h"
#include "cli/cli.h"
#include "core/json.h"
#include "core/log.h"
#include "core/units.h"
#include "hw/hw.h"
#include "models/model.h"
#include "planner/plan-file.h"
#include "serve/serve.h"
#include "tests/testutil.h"

/* A case that runs longer than this is a hang (the slowest legitimate
 * case, a search under ASan, takes well under a second). */
#define HANG_S 20

static guint32 seed = 24;
/* Warnings of the parsers that run in this process (a model type that is
 * not known, ...) are messages, not failures: kept quiet here. */
static guint quiet_handler;

static void
quiet (const char *domain, GLogLevelFlags level, const char *message,
       gpointer data)
{
}

static guint n_cases = 2000;
static char *tmp_dir;

/* ---- running one command in a child ------------------------------------ */

typedef struct
{
  int status; /* exit code, or -signal */
  char *out, *err;
} Outcome;

static void
outcome_clear (Outcome *o)
{
  g_clear_pointer (&o->out, g_free);
  g_clear_pointer (&o->err, g_free);
}

static char *
read_fd (int fd)
{
  off_t end = lseek (fd, 0, SEEK_END);
  g_assert_cmpint (end, >=, 0);
  g_assert_cmpint (end, <, (off_t)1 << 32);
  char *buf = g_malloc ((gsize)end + 1);
  gsize got = 0;
  while (got < (gsize)end)
    {
      ssize_t n = pread (fd, buf + got, (gsize)end - got, (off_t)got);
      if (n < 0 && errno == EINTR)
        continue;
      g_assert_cmpint (n, >, 0);
      got += (gsize)n;
    }
  buf[got] = '\0';
  return buf;
}

static const StowCommand *
command (const char *name)
{
  gsize n;
  const StowCommand *cmds = stow_cli_commands (&n);
  for (gsize i = 0; i < n; i++)
    if (strcmp (cmds[i].name, name) == 0)
      return &cmds[i];
  g_error ("no command %s", name);
}

/* Cases run in this process by default (a fork costs more than most cases
 * under AddressSanitizer); STOW_FUZZ_FORK=1 runs each in a child, so that
 * a crash ends one case and not the run (bench/fuzz.sh does). */
static gboolean use_fork;
/* The case being run, for a crash's last words. */
static char *current_case;
static int original_stderr = STDERR_FILENO;

static void
last_words (int sig)
{
  static const char head[] = "\nFUZZ CRASH (signal) while running:\n  ";
  if (current_case)
    {
      if (write (original_stderr, head, sizeof head - 1) < 0
          || write (original_stderr, current_case, strlen (current_case)) < 0
          || write (original_stderr, "\n", 1) < 0)
        {
        }
    }
  signal (sig, SIG_DFL);
  raise (sig);
}

static int
run_command (const char *const *argv)
{
  const StowCommand *cmd = command (argv[0]);
  /* GOption drops what it parsed from the array, not the strings: free
   * them from a copy. */
  char **copy = g_strdupv ((char **)argv);
  guint n = g_strv_length (copy);
  char **work = g_memdup2 (copy, sizeof (char *) * (n + 1));
  alarm (HANG_S);
  int rc = cmd->run ((int)n, work);
  alarm (0);
  g_strfreev (copy);
  g_free (work);
  return rc;
}

static void
run_case (const char *const *argv, const char *input, Outcome *o)
{
  int out_fd = memfd_create ("stdout", MFD_CLOEXEC);
  int err_fd = memfd_create ("stderr", MFD_CLOEXEC);
  g_assert_cmpint (out_fd, >=, 0);
  g_assert_cmpint (err_fd, >=, 0);
  g_autofree char *cmdline = g_strjoinv (" ", (char **)argv);
  g_free (current_case);
  current_case = g_strdup_printf ("seed %u: stowage %s\n  input: %.2000s", seed,
                                  cmdline, input ? input : "(none)");
  fflush (stdout);
  fflush (stderr);
  if (!use_fork)
    {
      int saved_out = dup (STDOUT_FILENO), saved_err = dup (STDERR_FILENO);
      original_stderr = saved_err;
      dup2 (out_fd, STDOUT_FILENO);
      dup2 (err_fd, STDERR_FILENO);
      o->status = run_command (argv);
      fflush (stdout);
      fflush (stderr);
      dup2 (saved_out, STDOUT_FILENO);
      dup2 (saved_err, STDERR_FILENO);
      original_stderr = STDERR_FILENO;
      close (saved_out);
      close (saved_err);
    }
  else
    {
      pid_t pid = fork ();
      g_assert_cmpint (pid, >=, 0);
      if (pid == 0)
        {
          dup2 (out_fd, STDOUT_FILENO);
          dup2 (err_fd, STDERR_FILENO);
          /* What cli/main.c does before a command: messages to stderr
           * (GTest's own handler would print them on stdout as TAP
           * notes, and ours here keeps them quiet). */
          g_log_remove_handler ("stowage", quiet_handler);
          g_log_set_default_handler (g_log_default_handler, NULL);
          stow_log_init (STOW_LOG_NORMAL);
          int rc = run_command (argv);
          fflush (stdout);
          fflush (stderr);
          _exit (rc);
        }
      int ws = 0;
      while (waitpid (pid, &ws, 0) < 0)
        g_assert_cmpint (errno, ==, EINTR);
      o->status = WIFEXITED (ws) ? WEXITSTATUS (ws) : -WTERMSIG (ws);
    }
  o->out = read_fd (out_fd);
  o->err = read_fd (err_fd);
  close (out_fd);
  close (err_fd);
}

static gboolean
wants_json (const char *const *argv)
{
  for (guint i = 0; argv[i]; i++)
    if (strcmp (argv[i], "--json") == 0
        || (strcmp (argv[i], "--format") == 0 && argv[i + 1]
            && strcmp (argv[i + 1], "json") == 0)
        || (strcmp (argv[i], "--emit") == 0 && argv[i + 1]
            && (strcmp (argv[i + 1], "plan") == 0
                || strcmp (argv[i + 1], "deepspeed") == 0)))
      return TRUE;
  return FALSE;
}

static guint n_failed;
/* How the cases of the parser under test ended: exit 0, 1, 2. */
static guint n_status[3];

/* Runs the case and checks the contract; prints what reproduces a
 * failure.  Returns the outcome's status. */
static int
check_case (const char *parser, guint i, const char *const *argv,
            const char *input)
{
  Outcome o = { 0 };
  run_case (argv, input, &o);
  const char *why = NULL;
  if (o.status == -SIGALRM)
    why = "hang (over " G_STRINGIFY (HANG_S) " s)";
  else if (o.status < 0)
    why = "crash (killed by a signal)";
  else if (o.status > 2)
    why = "exit status outside 0, 1, 2";
  else if (stow_text_has_nonfinite (o.out))
    why = "nan or inf in the output";
  g_autofree char *json_why = NULL;
  /* fit --emit writes nothing when nothing fits (exit 1) */
  if (why == NULL && o.status < 2 && wants_json (argv)
      && (o.status == 0 || o.out[0] != '\0')
      && (json_why = stow_json_problem (o.out)) != NULL)
    why = json_why;
  if (why)
    {
      g_autofree char *cmdline = g_strjoinv (" ", (char **)argv);
      g_test_message ("FUZZ FAILURE (%s): seed %u, %s case %u: %s\n"
                      "  stowage %s\n  exit %d\n  input: %.2000s\n"
                      "  stdout: %.2000s\n  stderr: %.4000s",
                      why, seed, parser, i, why, cmdline, o.status,
                      input ? input : "(none)", o.out, o.err);
      n_failed++;
    }
  int status = o.status;
  if (status >= 0 && status <= 2)
    n_status[status]++;
  if (g_getenv ("STOW_FUZZ_TRACE"))
    {
      /* every case's command and status, to compare two runs */
      g_autofree char *cmdline = g_strjoinv (" ", (char **)argv);
      g_printerr ("%s %u %d %s\n", parser, i, status, cmdline);
    }
  outcome_clear (&o);
  return status;
}

/* ---- mutations ---------------------------------------------------------- */

static const char *const numbers[] = {
  "0",
  "-0",
  "-1",
  "1",
  "2",
  "3",
  "7",
  "0.5",
  "1.5",
  "1e308",
  "1e309",
  "-1e309",
  "1e-320",
  "4294967295",
  "4294967296",
  "65536",
  "65537",
  "1048576",
  "16777217",
  "2147483648",
  "9223372036854775807",
  "9223372036854775808",
  "18446744073709551615",
  "18446744073709551616",
  "1e19",
  "100000000000000000000000",
  "3.3e33",
  "-4096",
  "1e6",
};

static const char *const values[] = {
  "\"\"",        "\"4k\"",       "\"80GB\"",  "\"-5GB/s\"", "\"1e400GB\"",
  "\"16EiB\"",   "\"2us\"",      "\"llama\"", "\"t5\"",     "\"mixtral\"",
  "\"\\u0000\"", "\"\xff\xfe\"", "[]",        "{}",         "null",
  "true",        "false",        "[1, 2]",    "{\"a\": 1}", "\"0x10\"",
  "\"A100\"",    "\"dgx-h100\"",
};

static const char *
pick (GRand *r, const char *const *list, gsize n)
{
  return list[g_rand_int_range (r, 0, (gint32)n)];
}

/* The spans of scalar tokens (strings, numbers, literals) in @text. */
static GArray *
scalar_spans (const char *text)
{
  GArray *spans = g_array_new (FALSE, FALSE, sizeof (gsize) * 2);
  gsize n = strlen (text);
  for (gsize i = 0; i < n; i++)
    {
      gsize start = i;
      if (text[i] == '"')
        {
          for (i++; i < n && text[i] != '"'; i++)
            if (text[i] == '\\')
              i++;
        }
      else if (text[i] == '-' || g_ascii_isalnum (text[i]))
        {
          while (i + 1 < n
                 && (g_ascii_isalnum (text[i + 1]) || text[i + 1] == '.'
                     || text[i + 1] == '-' || text[i + 1] == '+'))
            i++;
        }
      else
        continue;
      gsize span[2] = { start, MIN (i + 1, n) };
      g_array_append_vals (spans, span, 1);
    }
  return spans;
}

/* One to three mutations of @text, structure-aware most of the time: a
 * scalar swapped for an interesting number or value, a value nested past
 * the depth limit, or bytes flipped, cut or repeated. */
static char *
mutate_json (GRand *r, const char *text)
{
  GString *s = g_string_new (text);
  guint rounds = (guint)g_rand_int_range (r, 1, 3);
  for (guint k = 0; k < rounds; k++)
    {
      int op = g_rand_int_range (r, 0, 14);
      g_autoptr (GArray) spans = scalar_spans (s->str);
      if (op >= 10 && spans->len > 0)
        {
          /* a number scaled, or made small: values that pass the checks
           * and reach the models behind them */
          gsize *sp = &g_array_index (
              spans, gsize,
              2 * (gsize)g_rand_int_range (r, 0, (gint32)spans->len));
          if (!g_ascii_isdigit (s->str[sp[0]]))
            continue;
          static const double factors[]
              = { 0.5, 2, 3, 10, 1000, 1e6, 0.001, 1.0 / 3 };
          double v = g_ascii_strtod (s->str + sp[0], NULL);
          char buf[G_ASCII_DTOSTR_BUF_SIZE];
          if (g_rand_boolean (r))
            g_snprintf (buf, sizeof buf, "%d", g_rand_int_range (r, 1, 17));
          else
            g_ascii_dtostr (
                buf, sizeof buf,
                v * factors[g_rand_int_range (r, 0, G_N_ELEMENTS (factors))]);
          g_string_erase (s, (gssize)sp[0], (gssize)(sp[1] - sp[0]));
          g_string_insert (s, (gssize)sp[0], buf);
        }
      else if (op < 6 && spans->len > 0)
        {
          gsize *sp = &g_array_index (
              spans, gsize,
              2 * (gsize)g_rand_int_range (r, 0, (gint32)spans->len));
          gboolean is_number = s->str[sp[0]] != '"';
          const char *with = (is_number && g_rand_boolean (r)) || op < 3
                                 ? pick (r, numbers, G_N_ELEMENTS (numbers))
                                 : pick (r, values, G_N_ELEMENTS (values));
          g_string_erase (s, (gssize)sp[0], (gssize)(sp[1] - sp[0]));
          g_string_insert (s, (gssize)sp[0], with);
        }
      else if (op == 6 && spans->len > 0)
        {
          /* nest a value 60 to 70 deep, either side of the limit */
          gsize *sp = &g_array_index (
              spans, gsize,
              2 * (gsize)g_rand_int_range (r, 0, (gint32)spans->len));
          int depth = g_rand_int_range (r, 60, 71);
          for (int d = 0; d < depth; d++)
            g_string_insert_c (s, (gssize)sp[1] + d, ']');
          for (int d = 0; d < depth; d++)
            g_string_insert_c (s, (gssize)sp[0], '[');
        }
      else if (s->len > 0)
        {
          gsize at = (gsize)g_rand_int_range (r, 0, (gint32)s->len);
          gsize want = (gsize)g_rand_int_range (r, 1, 16);
          gsize len = MIN (want, s->len - at);
          if (op == 7)
            s->str[at] = (char)g_rand_int_range (r, 1, 256);
          else if (op == 8)
            g_string_erase (s, (gssize)at, (gssize)len);
          else
            {
              g_autofree char *dup = g_strndup (s->str + at, len);
              g_string_insert (s, (gssize)at, dup);
            }
        }
    }
  return g_string_free (s, FALSE);
}

/* A numeric flag's value: an interesting one, or digits with a unit, a
 * sign, a fraction, an exponent or stray characters. */
static char *
numeric_value (GRand *r)
{
  static const char *const special[] = {
    "0",
    "-1",
    "",
    " ",
    "1e400",
    "4294967296",
    "18446744073709551616",
    "9223372036854775808",
    "nan",
    "inf",
    "0x10",
    "1.5",
    "0.0001",
    "+8",
    "8 ",
    " 8",
    "1G",
    "1T",
    "16M",
    "64k",
    "1EiB",
    "2PB",
    "1e9",
    "1e30",
    "3.99999999999999999999",
    "007",
    "١٢",
    "8\xff",
  };
  static const char *const units[] = {
    "",    "",    "",    "k",   "K",   "M",  "G",  "B",  "T",   "KiB",
    "MiB", "GiB", "TiB", "PiB", "EiB", "TB", "GB", "e3", "e30", "%",
  };
  int kind = g_rand_int_range (r, 0, 4);
  if (kind == 0)
    return g_strdup (pick (r, special, G_N_ELEMENTS (special)));
  if (kind == 1 || kind == 2)
    {
      /* plausible: a small power of two or a small number */
      guint v = g_rand_boolean (r) ? 1u << g_rand_int_range (r, 0, 13)
                                   : (guint)g_rand_int_range (r, 1, 100);
      return g_strdup_printf ("%u%s", v,
                              g_rand_int_range (r, 0, 5) == 0
                                  ? pick (r, units, G_N_ELEMENTS (units))
                                  : "");
    }
  GString *s = g_string_new (NULL);
  if (g_rand_int_range (r, 0, 10) == 0)
    g_string_append_c (s, g_rand_boolean (r) ? '-' : '+');
  int digits = g_rand_int_range (r, 1, g_rand_int_range (r, 0, 4) ? 5 : 26);
  for (int i = 0; i < digits; i++)
    g_string_append_c (s, (char)('0' + g_rand_int_range (r, i == 0, 10)));
  if (g_rand_int_range (r, 0, 5) == 0)
    g_string_append_printf (s, ".%d", g_rand_int_range (r, 0, 1000));
  g_string_append (s, pick (r, units, G_N_ELEMENTS (units)));
  return g_string_free (s, FALSE);
}

/* ---- the parsers -------------------------------------------------------- */

static int
compare_names (gconstpointer a, gconstpointer b)
{
  return strcmp (*(const char *const *)a, *(const char *const *)b);
}

static GPtrArray *
seed_texts (const char *subdir, const char *suffix, const char *skip_prefix)
{
  g_autofree char *dir
      = g_test_build_filename (G_TEST_DIST, "data", subdir, NULL);
  g_autoptr (GDir) d = g_dir_open (dir, 0, NULL);
  g_assert_nonnull (d);
  GPtrArray *texts = g_ptr_array_new_with_free_func (g_free);
  g_autoptr (GPtrArray) names = g_ptr_array_new_with_free_func (g_free);
  const char *name;
  while ((name = g_dir_read_name (d)) != NULL)
    if (g_str_has_suffix (name, suffix)
        && !(skip_prefix && g_str_has_prefix (name, skip_prefix)))
      g_ptr_array_add (names, g_strdup (name));
  /* Directory order is the file system's: sort, so a seed means one run. */
  g_ptr_array_sort (names, compare_names);
  for (guint i = 0; i < names->len; i++)
    {
      g_autofree char *path = g_build_filename (dir, names->pdata[i], NULL);
      char *text = NULL;
      g_assert_true (g_file_get_contents (path, &text, NULL, NULL));
      g_ptr_array_add (texts, text);
    }
  g_assert_cmpuint (texts->len, >, 0);
  return texts;
}

static char *
write_input (const char *name, const char *text)
{
  /* Plain writes: g_file_set_contents would fsync every case. */
  char *path = g_build_filename (tmp_dir, name, NULL);
  FILE *f = fopen (path, "w");
  g_assert_nonnull (f);
  g_assert_cmpuint (fwrite (text, 1, strlen (text), f), ==, strlen (text));
  g_assert_cmpint (fclose (f), ==, 0);
  return path;
}

typedef void (*CaseFunc) (GRand *r, guint i, const char *path,
                          const char *input);

static void
fuzz_files (const char *parser, const char *subdir, const char *suffix,
            const char *skip, const char *file_name, CaseFunc run)
{
  g_autoptr (GPtrArray) seeds = seed_texts (subdir, suffix, skip);
  GRand *r = g_rand_new_with_seed (seed ^ g_str_hash (parser));
  guint n_ok = 0;
  memset (n_status, 0, sizeof n_status);
  gint64 t0 = g_get_monotonic_time ();
  for (guint i = 0; i < n_cases; i++)
    {
      const char *orig
          = seeds->pdata[g_rand_int_range (r, 0, (gint32)seeds->len)];
      g_autofree char *text = mutate_json (r, orig);
      g_autofree char *path = write_input (file_name, text);
      run (r, i, path, text);
      n_ok++;
    }
  g_test_message ("%s: %u cases in %.1f s, %u runs (exit 0: %u, 1: %u, 2: "
                  "%u), %u failures",
                  parser, n_ok, (g_get_monotonic_time () - t0) / 1e6,
                  n_status[0] + n_status[1] + n_status[2], n_status[0],
                  n_status[1], n_status[2], n_failed);
  g_rand_free (r);
  /* The mutations must reach past the parser, not only into its errors. */
  g_assert_cmpuint (n_status[0] + n_status[1], >, n_cases / 5);
  if (n_failed)
    g_test_fail_printf ("%u failures (the FUZZ FAILURE notes above)", n_failed);
  n_failed = 0;
}

/* The parser in this process first: an input it refuses must come with a
 * message naming the file, and only one in eight of those is run through
 * the command too (a fork is the expensive part of a case). */
static gboolean
parsed_here (GRand *r, gboolean ok, GError *error, const char *path)
{
  if (!ok)
    {
      g_assert_nonnull (error);
      g_autofree char *base = g_path_get_basename (path);
      if (strstr (error->message, base) == NULL)
        {
          g_test_message ("FUZZ FAILURE (error without the file name): "
                          "seed %u: %s",
                          seed, error->message);
          n_failed++;
        }
    }
  return ok || g_rand_int_range (r, 0, 8) == 0;
}

static void
config_case (GRand *r, guint i, const char *path, const char *input)
{
  g_autoptr (GError) error = NULL;
  g_autoptr (StowModel) m = stow_model_new_from_file (path, &error);
  if (!parsed_here (r, m != NULL, error, path))
    return;
  const char *model[] = { "model", path, "--json", NULL };
  if (check_case ("config.json", i, model, input) != 0)
    return;
  const char *mem[] = { "mem", path, "--gpus", "8xA100-80GB", "--json", NULL };
  check_case ("config.json", i, mem, input);
  if (g_rand_int_range (r, 0, 8) == 0)
    {
      const char *sim[]
          = { "simulate", path,       "--gpus", "1xA100-80GB", "--grad-accum",
              "2",        "--format", "md",     NULL };
      check_case ("config.json", i, sim, input);
    }
}

static void
test_fuzz_config (void)
{
  fuzz_files ("config.json", "hf", ".json", NULL, "config.json", config_case);
}

static void
cluster_case (GRand *r, guint i, const char *path, const char *input)
{
  g_autoptr (GError) error = NULL;
  g_autoptr (StowCluster) c = stow_cluster_new_from_file (path, &error);
  if (!parsed_here (r, c != NULL, error, path))
    return;
  const char *gpus[] = { "gpus", "--cluster", path, "--json", NULL };
  if (check_case ("cluster", i, gpus, input) != 0)
    return;
  const char *mem[] = { "mem", "llama-7b", "--cluster", path, "--json", NULL };
  check_case ("cluster", i, mem, input);
  if (g_rand_int_range (r, 0, 4) == 0)
    {
      const char *plan[] = { "plan", "llama-7b", "--cluster", path, "--top",
                             "2",    "--format", "html",      NULL };
      check_case ("cluster", i, plan, input);
    }
}

static void
test_fuzz_cluster (void)
{
  /* Profiles are read through cluster files (and as clusters): both. */
  fuzz_files ("cluster", "cluster", ".json", "bad-", "cluster.json",
              cluster_case);
}

static void
plan_case (GRand *r, guint i, const char *path, const char *input)
{
  g_autoptr (GError) error = NULL;
  g_autoptr (StowPlanFile) p = stow_plan_file_read (path, &error);
  if (!parsed_here (r, p != NULL, error, path))
    return;
  const char *mem[] = { "mem", "--plan", path, "--json", NULL };
  if (check_case ("plan file", i, mem, input) > 1)
    return;
  int k = g_rand_int_range (r, 0, 8);
  if (k == 0)
    {
      const char *sim[] = { "simulate", "--plan", path, "--json", NULL };
      check_case ("plan file", i, sim, input);
    }
  else if (k == 1)
    {
      const char *fit[]
          = { "fit", "--plan", path, "--emit", "deepspeed", NULL };
      check_case ("plan file", i, fit, input);
    }
}

static void
test_fuzz_plan (void)
{
  fuzz_files ("plan file", "golden", ".plan.json", NULL, "plan.json",
              plan_case);
}

/* Numeric flags on the planning commands, one to three at a time. */
static void
test_fuzz_flags (void)
{
  static const struct
  {
    const char *args[10];
  } bases[] = {
    { { "mem", "llama-7b", "--gpus", "8xA100-80GB", NULL } },
    { { "mem", "llama-7b", "--gpus", "8xA100-80GB", "--zero", "3", "--tp", "1",
        NULL } },
    { { "plan", "gpt2", "--gpus", "8xA100-80GB", "--top", "3", NULL } },
    { { "simulate", "gpt2", "--gpus", "4xA100-80GB", NULL } },
    { { "mem", "flan-t5-base", "--gpus", "2xA100-80GB", NULL } },
    { { "mem", "mixtral-8x7b", "--gpus", "8xH100-SXM", NULL } },
    { { "mem", "--params", "7B", "--convention", "zero-paper", "--gpus",
        "8xA100-80GB", NULL } },
    { { "fit", "gpt2", "--gpus", "1xA100-80GB", NULL } },
  };
  static const char *const flags[] = {
    "--seq",
    "--micro-batch",
    "--global-batch",
    "--grad-accum",
    "--dp",
    "--tp",
    "--pp",
    "--vpp",
    "--cp",
    "--ep",
    "--lora-rank",
    "--host-ram",
    "--nvme",
    "--context-memory",
    "--fragmentation",
    "--safety-margin",
    "--nccl-reserve",
    "--workspace-memory",
    "--reduce-bucket",
    "--decoder-seq",
    "--params",
    "--largest-layer",
    "--top",
    "--resident-layers",
    "--recompute",
    "--zero",
    "--gpus",
    "--host-process-memory",
  };
  static const char *const outputs[][2] = {
    { NULL, NULL },       { "--json", NULL },     { "--format", "csv" },
    { "--format", "md" }, { "--format", "html" }, { "--format", "json" },
  };
  GRand *r = g_rand_new_with_seed (seed ^ 0x5eed);
  gint64 t0 = g_get_monotonic_time ();
  guint by_status[3] = { 0 };
  for (guint i = 0; i < n_cases; i++)
    {
      g_autoptr (GPtrArray) argv = g_ptr_array_new_with_free_func (g_free);
      const char *const *base
          = bases[g_rand_int_range (r, 0, G_N_ELEMENTS (bases))].args;
      for (guint k = 0; base[k]; k++)
        g_ptr_array_add (argv, g_strdup (base[k]));
      gboolean sim = strcmp (base[0], "simulate") == 0;
      int n = g_rand_int_range (r, 1, 4);
      for (int k = 0; k < n; k++)
        {
          const char *flag = pick (r, flags, G_N_ELEMENTS (flags));
          g_autofree char *v = numeric_value (r);
          if (strcmp (flag, "--recompute") == 0)
            g_ptr_array_add (argv, g_strdup_printf ("--recompute=full:%s", v));
          else if (strcmp (flag, "--zero") == 0)
            g_ptr_array_add (argv, g_strdup_printf ("--zero=%s", v));
          else if (strcmp (flag, "--gpus") == 0)
            g_ptr_array_add (argv, g_strdup_printf ("--gpus=%sxA100-80GB", v));
          else if (strcmp (flag, "--top") == 0 && strcmp (base[0], "plan"))
            continue;
          else if (strcmp (flag, "--resident-layers") == 0 && !sim)
            continue;
          else
            g_ptr_array_add (argv, g_strdup_printf ("%s=%s", flag, v));
        }
      const char *const *out
          = outputs[g_rand_int_range (r, 0, G_N_ELEMENTS (outputs))];
      for (guint k = 0; k < 2 && out[k]; k++)
        g_ptr_array_add (argv, g_strdup (out[k]));
      g_ptr_array_add (argv, NULL);
      int status
          = check_case ("flags", i, (const char *const *)argv->pdata, NULL);
      if (status >= 0 && status <= 2)
        by_status[status]++;
    }
  g_test_message ("flags: %u cases in %.1f s (exit 0: %u, 1: %u, 2: %u), "
                  "%u failures",
                  n_cases, (g_get_monotonic_time () - t0) / 1e6, by_status[0],
                  by_status[1], by_status[2], n_failed);
  g_rand_free (r);
  /* The mutations must reach past the parsers, not only into their
   * errors. */
  g_assert_cmpuint (by_status[0] + by_status[1], >, n_cases / 10);
  if (n_failed)
    g_test_fail_printf ("%u failures (the FUZZ FAILURE notes above)", n_failed);
  n_failed = 0;
}

/* ---- the JSON API -------------------------------------------------------- */

/* What a request may be answered: never 500, never a crash; 403 and 502
 * only come from the Hub, which the suite keeps offline. */
static gboolean
status_ok (guint status)
{
  static const guint ok[] = { 200, 400, 404, 405, 413, 414, 415, 422 };
  for (gsize i = 0; i < G_N_ELEMENTS (ok); i++)
    if (status == ok[i])
      return TRUE;
  return FALSE;
}

static guint serve_status[600];

/* Answers one request in this process and checks the contract: a status
 * from the list; a failure is a JSON object whose "error" is a message
 * and whose "status" is the status; an answer has no NaN or infinity and,
 * as JSON, parses. */
static void
check_request (guint i, const char *method, const char *path, const char *query,
               const char *body, gsize len, const char *type)
{
  gsize n;
  const StowServeEndpoint *eps = stow_cli_api_endpoints (&n);
  StowServeReply r;
  stow_serve_reply_init (&r);
  g_free (current_case);
  current_case = g_strdup_printf (
      "seed %u: %s %s?%.2000s\n  body (%s): %.2000s", seed, method, path,
      query ? query : "", type ? type : "-", body ? body : "");
  alarm (HANG_S);
  stow_serve_answer (eps, n, NULL, method, path, query, body, len, type, &r);
  alarm (0);
  const char *why = NULL;
  g_autofree char *json_why = NULL;
  if (!status_ok (r.status))
    why = "a status outside the API's";
  else if (r.body->len == 0 && r.status != 200)
    why = "a failure without a body";
  else if (r.status == 200 && r.exit_code > 1)
    why = "an answer with exit status 2";
  /* (a failure may quote the "inf" it was given) */
  else if (r.status == 200 && stow_text_has_nonfinite (r.body->str))
    why = "nan or inf in the answer";
  else if (r.status == 200 && r.content_type
           && g_str_has_prefix (r.content_type, "application/json"))
    why = json_why = stow_json_problem (r.body->str);
  else if (r.status != 200)
    {
      g_autoptr (JsonNode) root = json_from_string (r.body->str, NULL);
      JsonObject *o = root && JSON_NODE_HOLDS_OBJECT (root)
                          ? json_node_get_object (root)
                          : NULL;
      if (o == NULL || !json_object_has_member (o, "error")
          || json_object_get_int_member_with_default (o, "status", 0)
                 != (gint64)r.status
          || strlen (
                 json_object_get_string_member_with_default (o, "error", ""))
                 == 0)
        why = "a failure that is not the API's JSON error";
    }
  if (why)
    {
      g_test_message ("FUZZ FAILURE (%s): seed %u, request %u: %s\n  status "
                      "%u, exit %d\n  answer: %.2000s",
                      why, seed, i, current_case, r.status, r.exit_code,
                      r.body->str);
      n_failed++;
    }
  if (r.status < G_N_ELEMENTS (serve_status))
    serve_status[r.status]++;
  stow_serve_reply_clear (&r);
}

/* How the requests since @t0 were answered; fails the test on a failed
 * contract, or when too few reached an answer (the mutations must reach
 * past the parsers, not only into their errors). */
static void
api_summary (const char *what, gint64 t0)
{
  g_autoptr (GString) by = g_string_new (NULL);
  for (guint st = 0; st < G_N_ELEMENTS (serve_status); st++)
    if (serve_status[st])
      g_string_append_printf (by, ", %u: %u", st, serve_status[st]);
  g_test_message ("%s: %u in %.1f s%s; %u failures", what, n_cases,
                  (g_get_monotonic_time () - t0) / 1e6, by->str, n_failed);
  g_assert_cmpuint (serve_status[200], >, n_cases / 10);
  if (n_failed)
    g_test_fail_printf ("%u failures (the FUZZ FAILURE notes above)", n_failed);
  n_failed = 0;
}

/* A query's value: an interesting one, as typed or escaped (or escaped
 * badly). */
static char *
query_value (GRand *r)
{
  static const char *const words[] = {
    "",
    "llama-7b",
    "gpt2",
    "mixtral-8x7b",
    "t5-3b",
    "8xA100-80GB",
    "1xA100-80GB",
    "4x8xH100-SXM",
    "local",
    "LOCAL",
    "cpu",
    "nvme",
    "none",
    "full",
    "selective",
    "true",
    "false",
    "maybe",
    "json",
    "html",
    "csv",
    "md",
    "text",
    "deepspeed",
    "megatron",
    "fsdp",
    "accelerate",
    "plan",
    "lora",
    "qlora",
    "bf16",
    "fp8",
    "zero-paper",
    "/etc/passwd",
    "../x.json",
    "org/name",
    "-x",
    "--output=/tmp/x",
    "\xc3\xa9",
    "a&b=c",
    "%",
    "%4",
    "%zz",
    "%00",
    "%c3%a9",
    "%ff",
    "+",
    "a+b",
    "=",
    "1=2",
  };
  if (g_rand_int_range (r, 0, 3) == 0)
    return numeric_value (r);
  const char *w = pick (r, words, G_N_ELEMENTS (words));
  /* Most go escaped as a client would; the rest as they are. */
  if (g_rand_boolean (r) && strchr (w, '%') == NULL)
    return g_uri_escape_string (w, NULL, FALSE);
  return g_strdup (w);
}

static const char *const api_names[] = {
  "model",
  "gpus",
  "seq",
  "micro-batch",
  "global-batch",
  "grad-accum",
  "tp",
  "pp",
  "dp",
  "vpp",
  "cp",
  "ep",
  "zero",
  "offload-optimizer",
  "offload-params",
  "recompute",
  "precision",
  "optimizer",
  "finetune",
  "engine",
  "json",
  "format",
  "emit",
  "explain",
  "top",
  "all-offloads",
  "tensors",
  "revision",
  "convention",
  "params",
  "host-ram",
  "nvme",
  "output",
  "chart",
  "plan",
  "cluster",
  "trace",
  "config",
  "verbose",
  "help",
  "micro_batch",
  "GPUS",
  "",
  "x",
  "sp",
  "no-sp",
  "layer-major",
  "resident-layers",
};

/* Each endpoint with a real question to start from. */
static const struct
{
  const char *path, *question;
} api_bases[] = {
  { "/api/fit", "model=llama-7b&gpus=8xA100-80GB" },
  { "/api/fit", "model=gpt2&gpus=2xA100-80GB" },
  { "/api/plan", "model=gpt2&gpus=4xA100-80GB&top=3" },
  { "/api/mem", "model=llama-7b&gpus=8xA100-80GB" },
  { "/api/mem", "model=flan-t5-base&gpus=2xA100-80GB" },
  { "/api/simulate", "model=gpt2&gpus=2xA100-80GB" },
  { "/api/model", "model=llama-7b" },
  { "/api/models", "" },
  { "/api/gpus", "gpus=8xA100-80GB" },
  { "/api/nope", "model=llama-7b" },
};

static void
test_fuzz_api_query (void)
{
  GRand *r = g_rand_new_with_seed (seed ^ 0xa91);
  memset (serve_status, 0, sizeof serve_status);
  gint64 t0 = g_get_monotonic_time ();
  for (guint i = 0; i < n_cases; i++)
    {
      /* Most questions start as real ones, so that the mutations reach
       * the planner and not only the parsers. */
      int b = g_rand_int_range (r, 0, G_N_ELEMENTS (api_bases));
      const char *path = api_bases[b].path;
      GString *q = g_string_new (
          g_rand_int_range (r, 0, 8) ? api_bases[b].question : NULL);
      int extra = g_rand_int_range (r, 0, 4) ? g_rand_int_range (r, 0, 3)
                                             : g_rand_int_range (r, 0, 6);
      for (int k = 0; k < extra; k++)
        {
          g_autofree char *v = query_value (r);
          const char *name = pick (r, api_names, G_N_ELEMENTS (api_names));
          int shape = g_rand_int_range (r, 0, 16);
          if (q->len)
            g_string_append_c (q, '&');
          if (shape == 0)
            g_string_append (q, name); /* a switch without a value */
          else if (shape == 1)
            g_string_append_printf (q, "=%s", v);
          else if (shape == 2)
            g_string_append_printf (q, "%s==%s&&", name, v);
          else
            g_string_append_printf (q, "%s=%s", name, v);
        }
      if (g_rand_int_range (r, 0, 50) == 0)
        {
          /* long: past the query's bound, or nearly */
          guint len = (guint)g_rand_int_range (r, 7000, 9000);
          g_string_append (q, "&seq=");
          while (q->len < len)
            g_string_append_c (q, '9');
        }
      const char *method = g_rand_int_range (r, 0, 20) == 0 ? "PUT" : "GET";
      check_request (i, method, path, q->str, NULL, 0, NULL);
      g_string_free (q, TRUE);
    }
  g_rand_free (r);
  api_summary ("api queries", t0);
}

/* JSON bodies: questions as objects, mutated as the file parsers' inputs
 * are; and pasted config.json files, mutated from the same seeds as the
 * config parser's. */
static void
test_fuzz_api_body (void)
{
  static const char *const bodies[] = {
    "{\"model\": \"llama-7b\", \"gpus\": \"8xA100-80GB\", \"micro-batch\": 2, "
    "\"json\": true}",
    "{\"model\": \"gpt2\", \"gpus\": \"4xA100-80GB\", \"top\": 3, \"seq\": "
    "\"4k\", \"explain\": null, \"zero\": 3}",
    "{\"params\": 7.5e9, \"convention\": \"zero-paper\", \"gpus\": "
    "\"64xA100-80GB\", \"zero\": 3}",
    "{\"gpus\": \"8xA100-80GB\", \"all-offloads\": true, \"model\": "
    "\"llama-13b\"}",
    "{\"model\": \"llama-7b\", \"gpus\": \"8xA100-80GB\", \"emit\": "
    "\"deepspeed\"}",
  };
  static const char *const types[] = {
    "application/json", "application/json; charset=utf-8",
    "APPLICATION/JSON", "application/x-www-form-urlencoded",
    "text/plain",       NULL,
  };
  static const char *const paths[]
      = { "/api/fit", "/api/mem", "/api/plan", "/api/model", "/api/gpus" };
  g_autoptr (GPtrArray) configs = seed_texts ("hf", ".json", NULL);
  GRand *r = g_rand_new_with_seed (seed ^ 0xb0d1);
  memset (serve_status, 0, sizeof serve_status);
  gint64 t0 = g_get_monotonic_time ();
  for (guint i = 0; i < n_cases; i++)
    {
      g_autofree char *body = NULL;
      const char *type = "application/json";
      const char *path = pick (r, paths, G_N_ELEMENTS (paths));
      int kind = g_rand_int_range (r, 0, 10);
      if (kind < 5)
        body = mutate_json (r, pick (r, bodies, G_N_ELEMENTS (bodies)));
      else if (kind < 9)
        {
          /* a pasted config, mutated, as a string or as an object */
          const char *orig
              = configs->pdata[g_rand_int_range (r, 0, (gint32)configs->len)];
          g_autofree char *cfg = mutate_json (r, orig);
          g_autoptr (JsonBuilder) b = json_builder_new ();
          json_builder_begin_object (b);
          json_builder_set_member_name (b, "gpus");
          json_builder_add_string_value (b, "8xA100-80GB");
          json_builder_set_member_name (b, "config");
          g_autoptr (JsonNode) obj = json_from_string (cfg, NULL);
          if (obj != NULL && g_rand_boolean (r))
            json_builder_add_value (b, g_steal_pointer (&obj));
          else
            json_builder_add_string_value (
                b, g_utf8_validate (cfg, -1, NULL) ? cfg : "{}");
          json_builder_end_object (b);
          g_autoptr (JsonNode) root = json_builder_get_root (b);
          body = json_to_string (root, FALSE);
          path = g_rand_boolean (r) ? "/api/model" : "/api/mem";
        }
      else
        {
          type = pick (r, types, G_N_ELEMENTS (types));
          body = g_rand_boolean (r)
                     ? g_strdup ("model=gpt2&gpus=1xA100-80GB&json=1")
                     : mutate_json (r, pick (r, bodies, G_N_ELEMENTS (bodies)));
        }
      /* The body's bytes as sent: the length, not the first NUL. */
      check_request (i, "POST", path, NULL, body, strlen (body), type);
    }
  g_rand_free (r);
  api_summary ("api bodies", t0);
}

/* The unit parsers themselves, in process, twenty times as many: every
 * input parses to a finite value or fails with a message quoting it. */
static void
test_fuzz_units (void)
{
  GRand *r = g_rand_new_with_seed (seed ^ 0x0417);
  for (guint i = 0; i < 20 * n_cases; i++)
    {
      g_autofree char *v = numeric_value (r);
      guint64 u = 0;
      double d = 0;
      for (int k = 0; k < 5; k++)
        {
          g_autoptr (GError) e = NULL;
          gboolean ok = k == 0   ? stow_parse_size (v, &u, &e)
                        : k == 1 ? stow_parse_count (v, &u, &e)
                        : k == 2 ? stow_parse_tokens (v, &u, &e)
                        : k == 3 ? stow_parse_duration (v, &d, &e)
                                 : stow_parse_bandwidth (v, &d, &e);
          if (ok)
            g_assert_true (isfinite (d) && d >= 0);
          else
            g_assert_nonnull (e);
        }
    }
  g_rand_free (r);
}

int
main (int argc, char **argv)
{
  g_test_init (&argc, &argv, NULL);
  const char *cases = g_getenv ("STOW_FUZZ_CASES");
  const char *s = g_getenv ("STOW_FUZZ_SEED");
  if (cases)
    n_cases = (guint)g_ascii_strtoull (cases, NULL, 10);
  if (s)
    seed = (guint32)g_ascii_strtoull (s, NULL, 10);
  g_test_message ("seed %u, %u cases per parser", seed, n_cases);
  /* As in the stowage binary, a warning is a message, not an abort
   * (g_test_init made it fatal); a critical is a bug, and aborts. */
  g_log_set_always_fatal (G_LOG_FATAL_MASK | G_LOG_LEVEL_CRITICAL);
  use_fork = g_strcmp0 (g_getenv ("STOW_FUZZ_FORK"), "1") == 0;
  setlocale (LC_ALL, "");
  signal (SIGABRT, last_words);
  signal (SIGSEGV, last_words);
  signal (SIGBUS, last_words);
  signal (SIGFPE, last_words);
  signal (SIGALRM, last_words);
  quiet_handler = g_log_set_handler ("stowage",
                                     G_LOG_LEVEL_WARNING | G_LOG_LEVEL_MESSAGE
                                         | G_LOG_LEVEL_INFO | G_LOG_LEVEL_DEBUG,
                                     quiet, NULL);
  tmp_dir = g_dir_make_tmp ("stow-fuzz-XXXXXX", NULL);
  g_assert_nonnull (tmp_dir);

  /* Load the catalogs once, before the first fork, so that each case
   * starts with them. */
  g_autoptr (StowModel) warm = stow_model_lookup ("llama-7b", NULL);
  gsize n;
  stow_gpu_catalog (&n);

  g_test_add_func ("/fuzz/config-json", test_fuzz_config);
  g_test_add_func ("/fuzz/cluster-file", test_fuzz_cluster);
  g_test_add_func ("/fuzz/plan-file", test_fuzz_plan);
  g_test_add_func ("/fuzz/numeric-flags", test_fuzz_flags);
  g_test_add_func ("/fuzz/units", test_fuzz_units);
  g_test_add_func ("/fuzz/api-query", test_fuzz_api_query);
  g_test_add_func ("/fuzz/api-body", test_fuzz_api_body);
  int rc = g_test_run ();

  const char *names[] = { "config.json", "cluster.json", "plan.json" };
  for (gsize i = 0; i < G_N_ELEMENTS (names); i++)
    {
      g_autofree char *p = g_build_filename (tmp_dir, names[i], NULL);
      g_unlink (p);
    }
  g_rmdir (tmp_dir);
  g_free (tmp_dir);
  return rc;
}
