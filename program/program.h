/* SPDX-License-Identifier: MIT
 *
 * program/program.h: the step program, the contract between the lowering
 * (planner/lower.c) and the backends that run it (planner/sim.c,
 * executor/backends/): ops on streams, ordered in each stream and joined
 * across streams only by events, over buffers that say which units'
 * tensors and which byte ranges they hold and what part they play.  No
 * seconds and no FLOPs: pricing belongs to the sim backend.  Depends on
 * core/ and models/ only.
 */
#pragma once

#include <glib.h>

#include "core/dtype.h"
#include "core/optim.h"
#include "models/model.h"

G_BEGIN_DECLS

#define STOW_PROGRAM_ERROR (stow_program_error_quark ())
GQuark stow_program_error_quark (void);

typedef enum
{
  STOW_PROGRAM_ERROR_INVALID, /* a malformed program, or a name unknown */
} StowProgramError;

typedef enum
{
  STOW_TIER_DEVICE,
  STOW_TIER_PINNED, /* page-locked host memory */
  STOW_TIER_HOST,   /* pageable host memory */
  STOW_TIER_NVME,
  STOW_N_TIERS
} StowTier;

const char *stow_tier_name (StowTier tier);

typedef enum
{
  STOW_STREAM_COMPUTE,
  STOW_STREAM_H2D,
  STOW_STREAM_D2H,
  STOW_STREAM_NVME_READ,
  STOW_STREAM_NVME_WRITE,
  STOW_STREAM_CPU_OPTIM,
  STOW_STREAM_COMM,
  STOW_N_STREAMS
} StowStream;

const char *stow_stream_name (StowStream s);

typedef enum
{
  STOW_OP_ALLOC,
  STOW_OP_FREE,
  STOW_OP_COPY, /* tier to tier: a byte range of a unit, or bytes */
  STOW_OP_FORWARD,
  STOW_OP_BACKWARD,
  STOW_OP_RECOMPUTE,
  STOW_OP_LOSS, /* output layer, loss and their backward */
  STOW_OP_OPTIM_STEP,
  STOW_OP_COLLECTIVE,
  STOW_OP_DATA,      /* tokens and targets of a micro-batch */
  STOW_OP_GRAD_NORM, /* the global gradient norm, for clipping */
  STOW_N_OP_KINDS
} StowOpKind;

const char *stow_op_kind_name (StowOpKind k);

typedef enum
{
  STOW_COLL_ALL_REDUCE,
  STOW_COLL_REDUCE_SCATTER,
  STOW_COLL_ALL_GATHER,
  STOW_COLL_SEND, /* pipeline point-to-point */
} StowCollective;

const char *stow_collective_name (StowCollective c);

typedef enum
{
  STOW_GROUP_DP,
  STOW_GROUP_TP,
  STOW_GROUP_PP,
} StowGroup;

#define STOW_NONE            G_MAXUINT /* no buffer, no event, no unit */
#define STOW_LAYER_EMBEDDING (-1)
#define STOW_LAYER_HEAD      (-2)
#define STOW_LAYER_NONE      (-3)
#define STOW_OP_MAX_IO       4

/* ---- units: the tensors streamed, gathered and updated as one ---------- */

typedef struct
{
  const char *name; /* HF checkpoint name (the model's inventory's) */
  guint64 shape[4];
  guint n_dims;
  guint64 numel;
  guint64 offset; /* elements from the unit's start */
  StowTensorRole role;
} StowUnitTensor;

typedef struct
{
  gint layer; /* STOW_LAYER_EMBEDDING, a layer index, STOW_LAYER_HEAD */
  guint first_tensor, n_tensors; /* into the program's unit_tensors */
  guint64 numel;                 /* elements of the whole unit */
  guint64 offset; /* elements from the model's start, units in order */
} StowUnit;

/* ---- optimizer settings: what a backend needs to update for real ------- */

/* StowOptimSettings and the learning-rate schedule: core/optim.h. */

/* ---- the fused output layer and loss ------------------------------------ */

/* stowage's runtimes run the output layer fused with the cross-entropy, a
 * chunk of tokens at a time, so that no (tokens, V) logits exist: the
 * chunk is the most tokens whose fp32 logits stay within this. */
#define STOW_LOSS_CHUNK_BYTES ((guint64)32 << 20)

/* Tokens of a chunk for @n tokens over @vocab: at least 1, at most @n. */
guint64 stow_loss_chunk_tokens (guint64 vocab, guint64 n);
/* Bytes of the loss's scratch for @n tokens: a chunk's normed input, its
 * logits and the input's gradient, fp32: 4 chunk (V + 2 h). */
guint64 stow_loss_scratch_bytes (guint64 vocab, guint64 hidden, guint64 n);

/* ---- ops, buffers, events ------------------------------------------------ */

/* What a copy moves, as the lowering emits it: a backend places the
 * copy's ends by this (and its unit, range or chunk), never by guessing
 * from the buffers it reads and writes. */
typedef enum
{
  STOW_COPY_BYTES,            /* bytes only, for the sim to price */
  STOW_COPY_GRADS_DOWN,       /* a unit's gradients of a micro-batch: its
                                 gradient slot to the host gradients */
  STOW_COPY_GRADS_UP,         /* a unit's earlier micro-batches' gradients
                                 back into its gradient slot */
  STOW_COPY_GRADS_ACCUMULATE, /* a gradient slot into the persistent
                                 gradients (device to device) */
  STOW_COPY_WEIGHTS_UP,       /* a unit's updated or streamed weights from
                                 the host (the host copy, or where CPU Adam
                                 wrote them) to the device */
  STOW_COPY_WEIGHTS_DOWN,     /* a unit's updated shard to the host copy */
  STOW_COPY_STAGED_UP,        /* a unit read from NVMe: its staging buffer
                                 to the device */
  STOW_COPY_CHUNK_UP,         /* an optimizer chunk's updated weights, the
                                 flat parameters [first, first + count) */
  STOW_COPY_STATES_READ,      /* an optimizer chunk's states from NVMe into
                                 its swap buffer */
  STOW_COPY_STATES_WRITE,     /* a swap buffer's chunk back to NVMe */
  STOW_COPY_PARAMS_READ,      /* a unit's weights from NVMe into its staging
                                 buffer */
  STOW_COPY_PARAMS_WRITE,     /* a unit's updated weights through the write
                                 buffer to NVMe */
  STOW_COPY_CHECKPOINT_DOWN,  /* an activation checkpoint to the host */
  STOW_COPY_CHECKPOINT_UP,    /* and back, before its backward */
} StowCopyKind;

typedef struct
{
  StowOpKind kind;
  StowStream stream;
  guint rank;
  gint layer; /* model layer, STOW_LAYER_EMBEDDING/_HEAD or _NONE */
  guint unit; /* the unit the op works on, or STOW_NONE */
  guint micro_batch;
  guint shard; /* optimizer chunk */
  /* copy: the bytes moved; with a unit, the range [offset, offset + bytes)
   * of the unit's bytes in the source and destination buffers' dtypes is
   * given by elements: [first, first + count) of the unit */
  guint64 bytes;
  guint64 first, count; /* elements; optim_step: of the rank's flat
                           parameters (units concatenated in order) */
  StowTier src, dst;    /* copy */
  StowCopyKind copy;    /* copy: what it moves */
  gboolean on_gpu;      /* optim_step */
  /* backward, loss: the parameter gradients this op writes are added to
   * what is there (TRUE) or overwrite it (FALSE: the first write of the
   * step, which is the zero-grad) */
  gboolean accumulate;
  StowCollective coll;
  StowGroup group;
  guint group_size;
  gboolean intra_node; /* the group stays inside one node */
  /* buffers: alloc/free name one in @buffer; others read and write */
  guint buffer;
  guint reads[STOW_OP_MAX_IO];
  guint n_reads;
  guint writes[STOW_OP_MAX_IO];
  guint n_writes;
  /* events: waits are a range of program->waits */
  guint wait_first, n_waits;
  guint record; /* event recorded when the op ends, or STOW_NONE */
} StowOp;

/* What a buffer's bytes are: the backends place tensors by it. */
typedef enum
{
  STOW_BUF_OTHER,       /* buckets, staging: bytes only */
  STOW_BUF_WEIGHTS,     /* units' weights, in the program's weight dtype */
  STOW_BUF_GRADS,       /* units' gradients, in the gradient dtype */
  STOW_BUF_MASTER,      /* fp32 master weights */
  STOW_BUF_OPT_STATES,  /* fp32 Adam moments: m then v, per unit */
  STOW_BUF_STATES,      /* master (if any), m and v together (offload) */
  STOW_BUF_INPUT,       /* a micro-batch's token ids, targets, embeddings */
  STOW_BUF_ACTIVATIONS, /* a layer's kept tensors for one micro-batch */
  STOW_BUF_CHECKPOINT,  /* full recompute: the layer's output only */
  STOW_BUF_RECOMPUTED,  /* full recompute: the rest, rebuilt in backward */
  STOW_BUF_WORKSPACE,   /* a layer's backward working set */
  STOW_BUF_LOGITS,      /* the fused loss's chunk */
  STOW_BUF_LOSS_GRAD,   /* the gradient the loss hands the last layer */
  STOW_N_BUF_KINDS
} StowBufferKind;

const char *stow_buffer_kind_name (StowBufferKind k);

/* A buffer the backends find by its part in the program (beside what its
 * bytes are, StowBufferKind), with its index among its peers. */
typedef enum
{
  STOW_ROLE_NONE,
  STOW_ROLE_LAYER_SLOT,    /* a rotating layer slot's bytes: index 0, 1 */
  STOW_ROLE_GRAD_SLOT,     /* a gradient slot's bytes: index 0, 1 */
  STOW_ROLE_PARAM_STAGING, /* a pinned staging buffer of NVMe weights:
                              index 0-3 */
  STOW_ROLE_PARAM_WRITE,   /* where updated weights pass to NVMe */
  STOW_ROLE_DELAYED_GRADS, /* the delayed update's second host copy of
                              the gradients (STOW_DELAYED_GRADS_NAME) */
  STOW_ROLE_SWAP,          /* an optimizer chunk on its way to and from
                              NVMe: index 0-2, its ring buffer */
} StowBufferRole;

/* The rotating slots a buffer may occupy (StowBuffer.slot): two layer
 * slots of weights, two gradient slots, four staging buffers of weights
 * read from NVMe. */
#define STOW_SLOT_LAYER   0 /* 0, 1 */
#define STOW_SLOT_GRADS   2 /* 2, 3 */
#define STOW_SLOT_STAGING 4 /* 4-7 */
#define STOW_N_SLOTS      8

/* Where a micro-batch's STOW_BUF_INPUT buffer keeps what it holds, in
 * bytes from its start, for n tokens: the token ids (n int32), the
 * targets (the next tokens, n int32), the embedding's output x (n, h) of
 * @x_bytes; @bytes in all. */
typedef struct
{
  guint64 tokens, targets, x, bytes;
} StowInputLayout;

static inline StowInputLayout
stow_input_layout (guint64 n_tokens, guint64 x_bytes)
{
  return (StowInputLayout){ .tokens = 0,
                            .targets = 4 * n_tokens,
                            .x = 8 * n_tokens,
                            .bytes = 8 * n_tokens + x_bytes };
}

typedef struct
{
  char *name;
  StowTier tier;
  guint64 bytes;
  guint rank;
  /* Rotating slots (STOW_SLOT_*): a buffer with a slot names the slot's
   * occupant for one use and has no bytes of its own: the bytes are the
   * persistent buffer of that role (STOW_ROLE_LAYER_SLOT, _GRAD_SLOT,
   * _PARAM_STAGING).  -1: not a slot. */
  gint slot;
  gboolean persistent; /* lives for the whole step, ready at the start */
  StowBufferKind kind;
  /* The units whose tensors it holds, [unit_first, unit_first + n_units)
   * in unit order, each at its offset within the run; STOW_NONE: none. */
  guint unit_first, n_units;
  StowDtype dtype;
  gint layer;        /* activations and the like: the layer */
  guint micro_batch; /* and the micro-batch */
  StowBufferRole role;
  guint role_index;
  /* ZeRO's partitions (core/zero.h): 0 or 1, each unit whole; N, each
   * unit's one partition of stow_zero_part (numel, N) elements, the rank's
   * own (the program is every data-parallel rank's). */
  guint partitions;
} StowBuffer;

/* A slot's occupant: it has no bytes of its own, its slot's persistent
 * buffer holds them. */
static inline gboolean
stow_buffer_is_occupant (const StowBuffer *buf)
{
  return buf->slot >= 0 && buf->bytes == 0;
}

typedef struct
{
  char *name;
  guint rank;
} StowEvent;

typedef struct
{
  guint n_ranks; /* pipeline stages */
  /* Data-parallel ranks that each run this program on their own
   * micro-batches (1: one), and its ZeRO stage: what its collectives,
   * partitioned buffers and optimizer ops mean (docs/executor.md). */
  guint dp, zero;
  GArray *ops;     /* StowOp, every rank's ops in emission order */
  GArray *buffers; /* StowBuffer */
  GArray *events;  /* StowEvent */
  GArray *waits;   /* guint event ids, ranges of ops */
  /* The model's units and their tensors (the whole model, unsharded). */
  GArray *units;        /* StowUnit */
  GArray *unit_tensors; /* StowUnitTensor */
  StowDtype weight_dtype, grad_dtype;
  /* Training that real backends need beside the ops. */
  guint64 seq_len, micro_batch, grad_accum; /* per rank */
  guint64 global_batch;                     /* sequences per step */
  StowOptimSettings optim;
  gboolean master_weights; /* fp32 master copy beside 16-bit weights */
  /* what the lowering chose, for reports */
  guint resident_layers;         /* per rank, of the streamed kind */
  guint streamed_layers;         /* per rank */
  guint64 device_capacity_bytes; /* tensor budget the plan was made for */
  guint64 overhead_bytes; /* non-tensor device bytes the memory model adds */
  double fragmentation;
  char *description;
} StowProgram;

StowProgram *stow_program_new (guint n_ranks);
void stow_program_free (StowProgram *p);
G_DEFINE_AUTOPTR_CLEANUP_FUNC (StowProgram, stow_program_free)

/* The units of @model in order: the embedding (input-side tables), each
 * layer, the head (everything else: final norm, untied lm_head).  Tied
 * tensors are left out, as the checkpoint leaves them out. */
void stow_program_set_units (StowProgram *p, const StowModel *model);
/* Index of the unit of @layer, or STOW_NONE. */
guint stow_program_unit_of_layer (const StowProgram *p, gint layer);
const StowUnit *stow_program_unit (const StowProgram *p, guint unit);
/* Tensor @name of @unit, or NULL. */
const StowUnitTensor *stow_program_unit_tensor (const StowProgram *p,
                                                guint unit, const char *name);

/* The persistent pinned buffer of ZeRO-Offload's delayed update: a second
 * host copy of the gradients, the last step's, which the backends trade
 * places with the host gradients at each step's start. */
#define STOW_DELAYED_GRADS_NAME "last step's gradients (delayed update)"

/* Building blocks (used by the lowering and by tests that build programs
 * by hand). */
guint stow_program_buffer (StowProgram *p, guint rank, StowTier tier,
                           guint64 bytes, gint slot, gboolean persistent,
                           const char *format, ...) G_GNUC_PRINTF (7, 8);
/* Gives buffer @b its part in the program (see StowBufferRole). */
void stow_program_buffer_role (StowProgram *p, guint b, StowBufferRole role,
                               guint index);
/* Says what buffer @b holds (kind, units, dtype, layer, micro-batch). */
void stow_program_buffer_holds (StowProgram *p, guint b, StowBufferKind kind,
                                guint unit_first, guint n_units,
                                StowDtype dtype, gint layer, guint mb);
/* Marks buffer @b as holding its units' ZeRO partitions over @n ranks. */
void stow_program_buffer_partition (StowProgram *p, guint b, guint n);
guint stow_program_event (StowProgram *p, guint rank, const char *format, ...)
    G_GNUC_PRINTF (3, 4);
/* Appends @op (copied; its wait range is set from @waits, @n_waits event
 * ids); returns its index. */
guint stow_program_add (StowProgram *p, const StowOp *op, const guint *waits,
                        guint n_waits);
/* An op initialised with no buffers, no events, no unit, layer _NONE. */
void stow_op_init (StowOp *op, StowOpKind kind, StowStream stream, guint rank);
/* "backward L12 mb3 (rank 0 compute)" */
char *stow_op_describe (const StowProgram *p, guint index);
/* Whether an evaluation run issues @op (stow_program_run_eval): buffer
 * allocs and frees, the data, the forward and the loss, and the copies
 * that bring weights to where the forward reads them (streamed up,
 * staged from NVMe); not the backward, recompute, norm, optimizer,
 * collectives or any copy of gradients, states or checkpoints. */
gboolean stow_op_in_eval (const StowOp *op);

/* Static checks: every waited event is recorded exactly once by some op,
 * every buffer is allocated and freed at most once, every op names valid
 * buffers and units.  The message names the op. */
gboolean stow_program_validate (const StowProgram *p, GError **error);

G_END_DECLS
