/* SPDX-License-Identifier: MIT
 *
 * tests/test-cli-tokenize.c: `stowage tokenize` as a user runs it: text
 * files (one document each, or per line) and JSONL (a text field, or
 * prompt/completion with loss masks) to llm.c shards of both widths, which
 * executor/data.c reads back; each document's ids those of the tokenizer
 * (data/tokenizer.c, itself checked against HF in test-tokenizer) between
 * BOS and EOS as the configs say; held-out documents by seed; the same
 * bytes for any number of threads; every bad input refused in one line
 * naming file and line, with exit 2 and nothing written.
 */
#include "config.h"

#include <string.h>

#include <gio/gio.h>
#include <glib.h>
#include <glib/gstdio.h>

#include "data/shards.h"
#include "data/tokenizer.h"
#include "executor/data.h"
#include "tests/testutil-io.h"
#include "tests/testutil.h"

typedef struct
{
  char *dir;
} Fixture;

static void
set_up (Fixture *f, gconstpointer data)
{
  f->dir = stow_test_tmpdir ("cli-tokenize");
}

static void
tear_down (Fixture *f, gconstpointer data)
{
  stow_test_rm_rf (f->dir);
  g_free (f->dir);
}

static char *
write_input (Fixture *f, const char *name, const char *text)
{
  char *path = g_build_filename (f->dir, name, NULL);
  stow_test_write_file (path, text, strlen (text));
  return path;
}

static char *
tokenizer_dir (const char *name)
{
  return stow_test_fixture ("tokenizers", name, NULL);
}

/* A copy of a fixture directory under @f (gunzipped), with
 * tokenizer_config.json replaced by @config when not NULL. */
static char *
copy_model_dir (Fixture *f, const char *name, const char *config)
{
  char *dst = g_build_filename (f->dir, name, NULL);
  g_assert_cmpint (g_mkdir_with_parents (dst, 0755), ==, 0);
  g_autofree char *src = tokenizer_dir (name);
  g_autoptr (GDir) d = g_dir_open (src, 0, NULL);
  const char *e;
  while ((e = g_dir_read_name (d)))
    {
      g_autofree char *from = g_build_filename (src, e, NULL);
      g_autoptr (GBytes) b = stow_test_read_file (from);
      g_autofree char *base = g_strdup (e);
      if (g_str_has_suffix (base, ".gz"))
        {
          g_autoptr (GConverter) z = G_CONVERTER (
              g_zlib_decompressor_new (G_ZLIB_COMPRESSOR_FORMAT_GZIP));
          g_autoptr (GInputStream) mem
              = g_memory_input_stream_new_from_bytes (b);
          g_autoptr (GInputStream) in = g_converter_input_stream_new (mem, z);
          g_autoptr (GOutputStream) out
              = g_memory_output_stream_new_resizable ();
          g_assert_cmpint (
              g_output_stream_splice (
                  out, in, G_OUTPUT_STREAM_SPLICE_CLOSE_TARGET, NULL, NULL),
              >, 0);
          g_bytes_unref (b);
          b = g_memory_output_stream_steal_as_bytes (
              G_MEMORY_OUTPUT_STREAM (out));
          base[strlen (base) - 3] = '\0';
        }
      g_autofree char *to = g_build_filename (dst, base, NULL);
      stow_test_write_file (to, g_bytes_get_data (b, NULL),
                            g_bytes_get_size (b));
    }
  if (config != NULL)
    {
      g_autofree char *to
          = g_build_filename (dst, "tokenizer_config.json", NULL);
      stow_test_write_file (to, config, strlen (config));
    }
  return dst;
}

static gint32
header_field (const guint8 *data, guint i)
{
  gint32 v;
  memcpy (&v, data + 4 * i, 4);
  return GINT32_FROM_LE (v);
}

/* The tokens of the shard at @path, checking its header: @magic, its
 * version, the count against the size. */
static GArray *
read_shard (const char *path, gint32 magic)
{
  g_autoptr (GBytes) b = stow_test_read_file (path);
  gsize len;
  const guint8 *data = g_bytes_get_data (b, &len);
  g_assert_cmpuint (len, >=, 1024);
  g_assert_cmpint (header_field (data, 0), ==, magic);
  g_assert_cmpint (header_field (data, 1), ==,
                   magic == STOW_SHARD_MAGIC_U16 ? 1 : 7);
  guint width = magic == STOW_SHARD_MAGIC_U16 ? 2 : 4;
  gint32 count = header_field (data, 2);
  g_assert_cmpuint (len, ==, 1024 + (gsize)count * width);
  for (guint i = 3; i < 256; i++)
    g_assert_cmpint (header_field (data, i), ==, 0);
  GArray *ids = g_array_new (FALSE, FALSE, sizeof (guint32));
  for (gint32 i = 0; i < count; i++)
    {
      guint32 v = 0;
      memcpy (&v, data + 1024 + (gsize)i * width, width);
      v = width == 2 ? GUINT16_FROM_LE ((guint16)v) : GUINT32_FROM_LE (v);
      g_array_append_val (ids, v);
    }
  /* And the trainer's reader takes it. */
  g_autoptr (GError) error = NULL;
  g_autoptr (StowTokenData) td
      = stow_token_data_open (path, STOW_TOKENIZER_NONE, 1u << 20, &error);
  if (count > 0)
    {
      g_assert_no_error (error);
      g_assert_cmpuint (stow_token_data_n_tokens (td), ==, (guint64)count);
    }
  return ids;
}

static GByteArray *
read_mask (const char *path, guint64 count)
{
  g_autoptr (GBytes) b = stow_test_read_file (path);
  gsize len;
  const guint8 *data = g_bytes_get_data (b, &len);
  g_assert_cmpuint (len, ==, 1024 + count);
  g_assert_cmpint (header_field (data, 0), ==, STOW_MASK_MAGIC);
  g_assert_cmpint (header_field (data, 1), ==, STOW_MASK_VERSION);
  g_assert_cmpint (header_field (data, 2), ==, (gint32)count);
  GByteArray *m = g_byte_array_new ();
  g_byte_array_append (m, data + 1024, (guint)count);
  return m;
}

static StowHfTokenizer *
load (const char *dir)
{
  g_autoptr (GError) error = NULL;
  StowHfTokenizer *t = stow_hf_tokenizer_new_from_path (dir, &error);
  g_assert_no_error (error);
  return t;
}

/* [bos] + encode(text) + [eos]. */
static void
append_doc (GArray *ids, StowHfTokenizer *t, gint64 bos, const char *text,
            gint64 eos)
{
  if (bos >= 0)
    {
      guint32 b = (guint32)bos;
      g_array_append_val (ids, b);
    }
  g_assert_true (stow_hf_tokenizer_encode (t, text, -1, FALSE, ids, NULL));
  guint32 e = (guint32)eos;
  g_array_append_val (ids, e);
}

static void
assert_same_ids (GArray *got, GArray *want)
{
  g_assert_cmpuint (got->len, ==, want->len);
  for (guint i = 0; i < got->len; i++)
    if (g_array_index (got, guint32, i) != g_array_index (want, guint32, i))
      g_error ("token %u: %u, want %u", i, g_array_index (got, guint32, i),
               g_array_index (want, guint32, i));
}

static void
test_help (void)
{
  g_auto (StowRun) r = { 0 };
  stow_run (&r, "tokenize", "--help", NULL);
  g_assert_cmpint (r.status, ==, 0);
  const char *flags[]
      = { "--tokenizer",    "--out",          "--split-lines",      "--format",
          "--text-field",   "--prompt-field", "--completion-field", "--threads",
          "--val-fraction", "--seed" };
  for (guint i = 0; i < G_N_ELEMENTS (flags); i++)
    g_assert_nonnull (strstr (r.out, flags[i]));
  /* Every flag that has a default says it. */
  const char *defaults[] = { "(default: one document per file)",
                             "(default auto",
                             "(default text)",
                             "(default prompt)",
                             "(default completion)",
                             "(default: one per core)",
                             "(default 0: none)",
                             "(default 0)" };
  for (guint i = 0; i < G_N_ELEMENTS (defaults); i++)
    g_assert_nonnull (strstr (r.out, defaults[i]));
  g_auto (StowRun) h = { 0 };
  stow_run (&h, "--help", NULL);
  g_assert_nonnull (strstr (h.out, "  tokenize "));
}

/* Text files, one document each, GPT-2 (uint16; no config: its only
 * special token ends documents, said on stderr).  "Hello world" is
 * 15496 995 in llama.cpp's GPT-2 vocabulary test. */
static void
test_text_gpt2 (Fixture *f, gconstpointer data)
{
  g_autofree char *a = write_input (f, "a.txt", "Hello world");
  g_autofree char *b
      = write_input (f, "b.txt", "Second file,\nwith two lines.\n");
  g_autofree char *prefix = g_build_filename (f->dir, "out", NULL);
  g_autofree char *tok = tokenizer_dir ("gpt2");
  g_auto (StowRun) r = { 0 };
  stow_run (&r, "tokenize", "--tokenizer", tok, "--out", prefix, a, b, NULL);
  g_assert_cmpint (r.status, ==, 0);
  g_assert_nonnull (strstr (r.err, "only special token \"<|endoftext|>\""));
  g_assert_nonnull (strstr (r.out, "uint16 tokens"));
  g_assert_nonnull (strstr (r.out, "2 documents"));
  g_autofree char *train = g_strconcat (prefix, "_train.bin", NULL);
  g_autoptr (GArray) ids = read_shard (train, STOW_SHARD_MAGIC_U16);
  g_assert_cmpuint (ids->len, >=, 4);
  g_assert_cmpuint (g_array_index (ids, guint32, 0), ==, 15496);
  g_assert_cmpuint (g_array_index (ids, guint32, 1), ==, 995);
  g_assert_cmpuint (g_array_index (ids, guint32, 2), ==, 50256);
  g_autoptr (StowHfTokenizer) t = load (tok);
  g_autoptr (GArray) want = g_array_new (FALSE, FALSE, sizeof (guint32));
  append_doc (want, t, -1, "Hello world", 50256);
  append_doc (want, t, -1, "Second file,\nwith two lines.\n", 50256);
  assert_same_ids (ids, want);
  g_autofree char *listing = stow_test_list_dir (f->dir);
  g_assert_cmpstr (listing, ==, "a.txt b.txt out_train.bin");
}

/* Qwen2.5's directory: 151,665 ids need the uint32 format; lines as
 * documents (blank lines skipped, CRLF taken off). */
static void
test_lines_qwen (Fixture *f, gconstpointer data)
{
  g_autofree char *dir = copy_model_dir (f, "qwen2.5", NULL);
  g_autofree char *in = write_input (
      f, "lines.txt",
      "first line\r\n\nsecond: 东京 1314151\n\n\n<|im_start|>third");
  g_autofree char *prefix = g_build_filename (f->dir, "q", NULL);
  g_auto (StowRun) r = { 0 };
  stow_run (&r, "tokenize", "--tokenizer", dir, "--out", prefix,
            "--split-lines", in, NULL);
  g_assert_cmpint (r.status, ==, 0);
  g_assert_cmpstr (r.err, ==, "");
  g_assert_nonnull (strstr (r.out, "uint32 tokens"));
  g_autofree char *train = g_strconcat (prefix, "_train.bin", NULL);
  g_autoptr (GArray) ids = read_shard (train, STOW_SHARD_MAGIC_U32);
  g_autoptr (StowHfTokenizer) t = load (dir);
  /* Qwen2.5-Instruct's config: EOS <|im_end|>, no BOS. */
  g_assert_cmpint (stow_hf_tokenizer_eos_id (t), ==, 151645);
  g_autoptr (GArray) want = g_array_new (FALSE, FALSE, sizeof (guint32));
  append_doc (want, t, -1, "first line", 151645);
  append_doc (want, t, -1, "second: 东京 1314151", 151645);
  append_doc (want, t, -1, "<|im_start|>third", 151645);
  assert_same_ids (ids, want);
}

/* BOS where the config adds it: [BOS] + tokens + EOS. */
static void
test_bos (Fixture *f, gconstpointer data)
{
  g_autofree char *dir = copy_model_dir (
      f, "phi3-mini",
      "{\"bos_token\": \"<s>\", \"eos_token\": \"</s>\", \"add_bos_token\": "
      "true}");
  g_autofree char *in = write_input (f, "d.jsonl",
                                     "{\"body\": \"Hello world\", \"x\": 1}\n"
                                     "{\"body\": \" this is 🦙.cpp\"}\n");
  g_autofree char *prefix = g_build_filename (f->dir, "p", NULL);
  g_auto (StowRun) r = { 0 };
  stow_run (&r, "tokenize", "--tokenizer", dir, "--out", prefix, "--text-field",
            "body", in, NULL);
  g_assert_cmpint (r.status, ==, 0);
  g_assert_nonnull (strstr (r.out, "each document: <s> + its tokens + </s>"));
  g_autofree char *train = g_strconcat (prefix, "_train.bin", NULL);
  g_autoptr (GArray) ids = read_shard (train, STOW_SHARD_MAGIC_U16);
  /* llama.cpp's Phi-3 vectors: "Hello world" 15043 3186, " this is
   * 🦙.cpp" 29871 445 338 29871 243 162 169 156 29889 8223. */
  const guint32 want[] = { 1,     15043, 3186, 2,   1,   29871, 445,  338,
                           29871, 243,   162,  169, 156, 29889, 8223, 2 };
  g_assert_cmpuint (ids->len, ==, G_N_ELEMENTS (want));
  for (guint i = 0; i < G_N_ELEMENTS (want); i++)
    g_assert_cmpuint (g_array_index (ids, guint32, i), ==, want[i]);
}

/* Prompt/completion records: the whole sequence, and a mask of 0 over BOS
 * and the prompt's tokens, 1 over the completion's and EOS; text documents
 * in the same run are all 1 but BOS. */
static void
test_sft (Fixture *f, gconstpointer data)
{
  g_autofree char *dir = copy_model_dir (
      f, "phi3-mini",
      "{\"bos_token\": \"<s>\", \"eos_token\": \"<|end|>\", \"add_bos_token\": "
      "true}");
  g_autofree char *sft = write_input (
      f, "sft.jsonl",
      "{\"prompt\": \"<|user|>\\nWhat is 2+2?<|end|>\\n<|assistant|>\", "
      "\"completion\": \"4, of course.\"}\n"
      "{\"prompt\": \"\", \"completion\": \"Only a completion\"}\n");
  g_autofree char *txt = write_input (f, "plain.txt", "Plain text");
  g_autofree char *prefix = g_build_filename (f->dir, "s", NULL);
  g_auto (StowRun) r = { 0 };
  stow_run (&r, "tokenize", "--tokenizer", dir, "--out", prefix, sft, txt,
            NULL);
  g_assert_cmpint (r.status, ==, 0);
  g_autofree char *train = g_strconcat (prefix, "_train.bin", NULL);
  g_autofree char *mask_path = g_strconcat (prefix, "_train.mask", NULL);
  g_assert_nonnull (strstr (r.out, mask_path));
  g_autoptr (GArray) ids = read_shard (train, STOW_SHARD_MAGIC_U16);
  g_autoptr (GByteArray) mask = read_mask (mask_path, ids->len);
  g_autoptr (StowHfTokenizer) t = load (dir);
  g_autoptr (GArray) want = g_array_new (FALSE, FALSE, sizeof (guint32));
  g_autoptr (GByteArray) want_mask = g_byte_array_new ();
  const char *docs[][2] = {
    { "<|user|>\nWhat is 2+2?<|end|>\n<|assistant|>", "4, of course." },
    { "", "Only a completion" },
    { NULL, "Plain text" },
  };
  for (guint d = 0; d < G_N_ELEMENTS (docs); d++)
    {
      g_autofree char *all
          = g_strconcat (docs[d][0] ? docs[d][0] : "", docs[d][1], NULL);
      g_autoptr (GArray) p = g_array_new (FALSE, FALSE, sizeof (guint32));
      if (docs[d][0])
        g_assert_true (
            stow_hf_tokenizer_encode (t, docs[d][0], -1, FALSE, p, NULL));
      guint before = want->len;
      append_doc (want, t, 1, all, 32007);
      for (guint i = before; i < want->len; i++)
        {
          guint8 m = i == before || i <= before + p->len ? 0 : 1;
          g_byte_array_append (want_mask, &m, 1);
        }
    }
  assert_same_ids (ids, want);
  g_assert_cmpuint (mask->len, ==, want_mask->len);
  g_assert_cmpmem (mask->data, mask->len, want_mask->data, want_mask->len);
  /* The completion's tokens do count: a 1 in the first document. */
  g_assert_nonnull (memchr (mask->data, 1, 20));
}

/* Many documents: the same files for 1 and 3 threads; the held-out ones
 * follow the seed, and the two files hold every document once. */
static void
test_threads_and_val (Fixture *f, gconstpointer data)
{
  GString *text = g_string_new (NULL);
  for (guint i = 0; i < 30000; i++)
    g_string_append_printf (text,
                            "{\"text\": \"Document %u: the quick brown "
                            "fox %u jumps over %x lazy dogs.\"}\n",
                            i, i * 7919, i * 31);
  g_autofree char *in = write_input (f, "many.jsonl", text->str);
  g_string_free (text, TRUE);
  g_autofree char *tok = tokenizer_dir ("phi3-mini");
  char *outs[3];
  const char *threads[] = { "1", "3", "3" };
  const char *seeds[] = { "5", "5", "6" };
  for (guint k = 0; k < 3; k++)
    {
      g_autofree char *prefix = g_strdup_printf ("%s/t%u", f->dir, k);
      g_auto (StowRun) r = { 0 };
      stow_run (&r, "tokenize", "--tokenizer", tok, "--out", prefix,
                "--threads", threads[k], "--val-fraction", "0.1", "--seed",
                seeds[k], in, NULL);
      g_assert_cmpint (r.status, ==, 0);
      outs[k] = g_steal_pointer (&prefix);
    }
  for (guint s = 0; s < 2; s++)
    {
      const char *split = s ? "_val.bin" : "_train.bin";
      g_autofree char *p0 = g_strconcat (outs[0], split, NULL);
      g_autofree char *p1 = g_strconcat (outs[1], split, NULL);
      g_autofree char *p2 = g_strconcat (outs[2], split, NULL);
      g_autoptr (GBytes) b0 = stow_test_read_file (p0);
      g_autoptr (GBytes) b1 = stow_test_read_file (p1);
      g_autoptr (GBytes) b2 = stow_test_read_file (p2);
      g_assert_true (g_bytes_equal (b0, b1));
      g_assert_false (g_bytes_equal (b0, b2));
    }
  /* Every document once: EOS (32000) counts documents. */
  g_autofree char *tp = g_strconcat (outs[0], "_train.bin", NULL);
  g_autofree char *vp = g_strconcat (outs[0], "_val.bin", NULL);
  g_autoptr (GArray) tr = read_shard (tp, STOW_SHARD_MAGIC_U16);
  g_autoptr (GArray) va = read_shard (vp, STOW_SHARD_MAGIC_U16);
  guint n_tr = 0, n_va = 0;
  for (guint i = 0; i < tr->len; i++)
    n_tr += g_array_index (tr, guint32, i) == 32000;
  for (guint i = 0; i < va->len; i++)
    n_va += g_array_index (va, guint32, i) == 32000;
  g_assert_cmpuint (n_tr + n_va, ==, 30000);
  /* About a tenth held out (binomial: 3000 +- 52). */
  g_assert_cmpuint (n_va, >, 2700);
  g_assert_cmpuint (n_va, <, 3300);
  for (guint k = 0; k < 3; k++)
    g_free (outs[k]);
}

/* One line on stderr (and a hint) naming file and line, exit 2, no file left,
 * and an older output untouched. */
static void
check_refused (Fixture *f, const char *const *inputs, const char *tok,
               const char *fragment)
{
  g_autofree char *prefix = g_build_filename (f->dir, "o", NULL);
  g_autofree char *old = g_strconcat (prefix, "_train.bin", NULL);
  stow_test_write_file (old, "old", 3);
  g_autofree char *before = stow_test_list_dir (f->dir);
  g_autoptr (GPtrArray) args = g_ptr_array_new ();
  const char *head[] = { "tokenize", "--tokenizer",    tok,  "--out",
                         prefix,     "--val-fraction", "0.5" };
  for (guint i = 0; i < G_N_ELEMENTS (head); i++)
    g_ptr_array_add (args, (gpointer)head[i]);
  for (guint i = 0; inputs[i]; i++)
    g_ptr_array_add (args, (gpointer)inputs[i]);
  g_ptr_array_add (args, NULL);
  g_auto (StowRun) r = { 0 };
  stow_runv (&r, (const char *const *)args->pdata);
  g_assert_cmpint (r.status, ==, 2);
  g_assert_cmpstr (r.out, ==, "");
  /* One line, and maybe a hint of what to do. */
  g_assert_cmpuint (
      stow_count_lines (r.err) - (strstr (r.err, "\nhint: ") != NULL), ==, 1);
  if (strstr (r.err, fragment) == NULL)
    g_error ("stderr \"%s\" lacks \"%s\"", r.err, fragment);
  g_autofree char *after = stow_test_list_dir (f->dir);
  g_assert_cmpstr (after, ==, before);
  g_autoptr (GBytes) b = stow_test_read_file (old);
  g_assert_cmpuint (g_bytes_get_size (b), ==, 3);
}

static void
test_bad_input (Fixture *f, gconstpointer data)
{
  g_autofree char *tok = tokenizer_dir ("phi3-mini");
  g_autofree char *good = write_input (f, "good.txt", "fine");
  g_autofree char *notjson
      = write_input (f, "a.jsonl", "{\"text\": \"ok\"}\n{\"text\": oops}\n");
  g_autofree char *missing
      = write_input (f, "b.jsonl", "{\"text\": \"ok\"}\n\n{\"txt\": \"x\"}\n");
  g_autofree char *number
      = write_input (f, "c.jsonl", "{\"text\": \"ok\"}\n{\"text\": 3}\n");
  g_autofree char *emptyf
      = write_input (f, "d.jsonl", "{\"text\": \"ok\"}\n{\"text\": \"\"}\n");
  g_autofree char *array = write_input (f, "e.jsonl", "[1, 2]\n");
  g_autofree char *sft
      = write_input (f, "f.jsonl",
                     "{\"prompt\": \"a\", \"completion\": \"b\"}\n"
                     "{\"prompt\": \"a\"}\n");
  g_autofree char *empty = write_input (f, "empty.txt", "");
  g_autofree char *badutf = write_input (f, "bad.txt", "ok\nfine\nab\xff\n");
  g_autofree char *deep = g_strnfill (100000, '[');
  g_autofree char *deepf = write_input (f, "g.jsonl", deep);
  g_autofree char *nofile = g_build_filename (f->dir, "nope.txt", NULL);
  struct
  {
    const char *inputs[4];
    const char *says;
  } cases[] = {
    { { good, notjson }, "a.jsonl:2: not JSON" },
    { { missing }, "b.jsonl:3: no \"text\" field" },
    { { number }, "c.jsonl:2: \"text\" is number 3, not a string" },
    { { emptyf }, "d.jsonl:2: \"text\" is empty" },
    { { array }, "e.jsonl:1: expected a JSON object" },
    { { sft }, "f.jsonl:2: no \"completion\" field" },
    { { empty }, "empty.txt: an empty document" },
    { { good, nofile }, "nope.txt" },
    { { deepf }, "g.jsonl:1: not JSON" },
  };
  for (guint i = 0; i < G_N_ELEMENTS (cases); i++)
    check_refused (f, cases[i].inputs, tok, cases[i].says);
  /* Lines: the line number and the byte. */
  g_autofree char *prefix = g_build_filename (f->dir, "o", NULL);
  g_auto (StowRun) r = { 0 };
  stow_run (&r, "tokenize", "--tokenizer", tok, "--out", prefix,
            "--split-lines", badutf, NULL);
  g_assert_cmpint (r.status, ==, 2);
  g_assert_nonnull (strstr (r.err, "bad.txt:3: the text is not UTF-8: byte 2 "
                                   "(0xff)"));
  /* --out into a folder that is not there: made for the output, and gone
   * again when there is none. */
  g_autofree char *newdir = g_build_filename (f->dir, "new", NULL);
  g_autofree char *inside = g_build_filename (newdir, "qa", NULL);
  g_auto (StowRun) rn = { 0 };
  stow_run (&rn, "tokenize", "--tokenizer", tok, "--out", inside, notjson,
            NULL);
  g_assert_cmpint (rn.status, ==, 2);
  g_assert_false (g_file_test (newdir, G_FILE_TEST_EXISTS));
  g_auto (StowRun) ro = { 0 };
  stow_run (&ro, "tokenize", "--tokenizer", tok, "--out", inside, good, NULL);
  g_assert_cmpint (ro.status, ==, 0);
  g_autofree char *made = stow_test_list_dir (newdir);
  g_assert_cmpstr (made, ==, "qa_train.bin");
}

static void
test_bad_tokenizer (Fixture *f, gconstpointer data)
{
  g_autofree char *good = write_input (f, "good.txt", "fine");
  g_autofree char *dir = g_build_filename (f->dir, "model", NULL);
  g_mkdir (dir, 0755);
  g_autofree char *tj = g_build_filename (dir, "tokenizer.json", NULL);
  const char *corrupt[][2] = {
    { "{\"model\": {\"type\": \"BPE\", \"vocab\": {\"a\": 0}, \"merges\": "
      "[\"a b\"]}}",
      "tokenizer.json: model.merges[0]: \"b\" is not in model.vocab" },
    { "{\"model\": {\"type\": \"WordPiece\", \"vocab\": {}}}",
      "tokenizer.json: model.type \"WordPiece\" is not supported" },
    { "{\"model\": {\"type\": \"BPE\", \"vocab\": {\"a\": 0}, \"merges\": "
      "[]}, \"pre_tokenizer\": {\"type\": \"Split\", \"pattern\": {\"Regex\": "
      "\"[\"}, \"behavior\": \"Isolated\", \"invert\": false}}",
      "tokenizer.json: pre_tokenizer.pattern.Regex: not a regex" },
    { "{\"model\": {\"type\": \"BPE\", \"vocab\": {\"a\": 0}, \"merg",
      "tokenizer.json:1:" },
  };
  const char *inputs[] = { good, NULL };
  for (guint i = 0; i < G_N_ELEMENTS (corrupt); i++)
    {
      stow_test_write_file (tj, corrupt[i][0], strlen (corrupt[i][0]));
      check_refused (f, inputs, dir, corrupt[i][1]);
    }
  /* No EOS and no single special token: refused, saying what to do. */
  const char *no_eos = "{\"model\": {\"type\": \"BPE\", \"vocab\": {\"f\": 0, "
                       "\"i\": 1, \"n\": 2, \"e\": 3}, \"merges\": []}}";
  stow_test_write_file (tj, no_eos, strlen (no_eos));
  check_refused (f, inputs, dir, "names no EOS token");
}

static void
test_usage (void)
{
  const char *no_tok[] = { "tokenize", "--out", "x", "in.txt", NULL };
  stow_assert_usage_error (no_tok, "--tokenizer DIR|FILE is required");
  const char *no_out[] = { "tokenize", "--tokenizer", "t", "in.txt", NULL };
  stow_assert_usage_error (no_out, "--out PREFIX is required");
  const char *no_in[] = { "tokenize", "--tokenizer", "t", "--out", "x", NULL };
  stow_assert_usage_error (no_in, "no input files");
  const char *frac[] = { "tokenize",       "--tokenizer", "t",  "--out", "x",
                         "--val-fraction", "1",           "in", NULL };
  stow_assert_usage_error (frac, "--val-fraction \"1\"");
  const char *thr[] = { "tokenize",  "--tokenizer", "t",  "--out", "x",
                        "--threads", "0",           "in", NULL };
  stow_assert_usage_error (thr, "--threads \"0\"");
  const char *fmt[] = { "tokenize", "--tokenizer", "t",  "--out", "x",
                        "--format", "csv",         "in", NULL };
  stow_assert_usage_error (fmt, "--format \"csv\"");
  const char *hub[]
      = { "tokenize", "--tokenizer", "Qwen/Qwen2.5-0.5B", "--out", "x",
          "in",       NULL };
  /* A Hub id, offline and not in the cache (the suite's environment). */
  stow_assert_usage_error (hub, "HF_HUB_OFFLINE forbids downloading");
}

int
main (int argc, char **argv)
{
  g_test_init (&argc, &argv, NULL);
  g_test_add_func ("/cli-tokenize/help", test_help);
  g_test_add_func ("/cli-tokenize/usage", test_usage);
  g_test_add ("/cli-tokenize/text-gpt2", Fixture, NULL, set_up, test_text_gpt2,
              tear_down);
  g_test_add ("/cli-tokenize/lines-qwen", Fixture, NULL, set_up,
              test_lines_qwen, tear_down);
  g_test_add ("/cli-tokenize/bos", Fixture, NULL, set_up, test_bos, tear_down);
  g_test_add ("/cli-tokenize/sft", Fixture, NULL, set_up, test_sft, tear_down);
  g_test_add ("/cli-tokenize/threads-and-val", Fixture, NULL, set_up,
              test_threads_and_val, tear_down);
  g_test_add ("/cli-tokenize/bad-input", Fixture, NULL, set_up, test_bad_input,
              tear_down);
  g_test_add ("/cli-tokenize/bad-tokenizer", Fixture, NULL, set_up,
              test_bad_tokenizer, tear_down);
  return g_test_run ();
}
