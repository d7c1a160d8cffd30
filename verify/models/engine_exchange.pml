/* The reduce-scatter by braid's Hopper GEMM with the peers' rows carried by the copy engines: the products, their
 * ready counts, the gates, copies and posts of the side stream, the received blocks and their arrived flags, and
 * the entry meeting, across back-to-back calls.
 *
 * Models (file:function):
 *   src/kernels/matmul_sm90.cu: matmul_sm90<T, Variant::kEngineReduceScatter>, engine_gate (wait until the
 *     chunk's ready count reaches the target, then reset it to 0), engine_post (a system fence, then a release
 *     store of 1 into the peer's arrived flag)
 *   src/kernels/matmul_sm90_engine_exchange.cuh: NOTE [reduce-scatter by the copy engines], store_engine_rows (a
 *     peer's tile: stored into this rank's products for that peer, a fence, then a count a warp into the ready
 *     count of the tile's chunk; an own tile: wait until every peer's arrived flag for the tile's chunk is set
 *     (acquire), then read the received rows of every slot)
 *   src/kernels/matmul_sm90_exchange.cuh: finish_exchange (the last block resets this rank's arrived flags, then
 *     stores the stamp as the call count and into the peers' freed words)
 *   src/overlap/fused_matmul.cpp: FusedMatmulState::run_exchanged (the side stream forked from the caller's stream
 *     before the GEMM's launch; the caller's stream waits for the side's work after it), copy_engine_rows (on the
 *     side stream: the entry meeting, an all-reduce of every rank, then for each destination in order (rank + 1
 *     first) and each chunk in order: the gate, the copy (cudaMemcpyAsync) of the chunk of the products into the
 *     peer's received block for this rank, the post)
 *
 * Each rank is a process that runs two streams' work as its steps interleave: the caller's stream (the GEMM of a
 * call, then the wait for the side stream) and the side stream (forked at the start of each call, so it starts
 * once the caller's stream has reached that call: after the rank's previous call has ended, its side's work
 * included). One process a rank keeps the claim and the fairness to pan's default of processes. A peer tile stands
 * for the tiles of a chunk of a destination's block that one warp stores and counts (WARPS of them a chunk, so the
 * gate's target is WARPS); an own tile for the tiles of one chunk of this rank's block. The own tiles run at any
 * time among the peer tiles (the kernel orders a block's peer tiles before its own, but the blocks run at once, and
 * an own tile's wait holds up no other block's tiles); the peer tiles run in the order the gates take them
 * (destinations, chunks, warps): they write only this rank's products and counts, which only this rank's gates and
 * copies read, one chunk after the other, so a chunk counted out of that order is seen as if counted when the
 * gates reach it. The GEMM ends (its last block, finish_exchange) once all are done. A call stands for an eager
 * call and for a graph replay alike: the counts and flags return to 0 within a call, in device memory.
 *
 * Tags: what a block of rows holds is the call (+ 1) whose GEMM stored it: products[] the tag a warp stored into
 * its part of a chunk of the products, received[] the tag a copy carried into the peer's block (0: a chunk whose
 * parts were of different calls, a torn copy). A read asserts the tag of its own call. The call count and the freed
 * words (finish_exchange) are left out: this protocol waits on neither; the other kinds wait on the freed words.
 *
 * Weak ordering: a copy reads the products when it starts (the gate has seen every count of the chunk: the GEMM's
 * stores before their counts, fenced), and its rows land in the peer's received block at a later step, any other
 * rank's steps between; it completes as it lands, and the post follows (no rank reads the block between the
 * landing and the post: the peer's own tiles wait for the post, and the side's next operation for the completion).
 * The post's release store follows the copy's completion; an own tile's acquire orders its reads after the flags.
 * The counts and flags are plain words that return to 0: the gate compares >=, an own tile waits for 1.
 *
 * The steps are written out for SLOTS 2 and CHUNKS 2 (the own tiles, the arrived reset) and RANKS 3 (the meeting).
 *
 * Properties:
 *   - a rank reads a peer's chunk only once the peer's rows of this call have landed (assert in the own tile);
 *   - no copy writes into a peer's received block while the peer still reads it (assert when a copy starts and
 *     when it lands): the peer's reads of a call and the copies of the next never overlap;
 *   - a gate passes only once this call's GEMM has stored and counted the whole chunk, never on a count of an
 *     earlier call (assert in the gate);
 *   - a post finds the peer's flag reset: no arrived flag of an earlier call is left for a later call's wait, nor
 *     is a post's flag reset before its call's own tiles saw it (assert in the post);
 *   - no deadlock (invalid end states); every rank finishes every call (ltl all_finish, weak fairness).
 *
 * @run real                       safety         pass
 * @run real_progress              ltl:all_finish pass
 * @run MUTANT_NO_ENTRY_MEETING    safety         assert
 *        the side stream copies without the entry meeting: a rank a call ahead overwrites rows its peer has yet to
 *        read, and posts into a flag that the peer's last block then resets
 * @run MUTANT_NO_ARRIVED_RESET    safety         assert
 *        the last block leaves the arrived flags set: the next call's own tiles read before the peers' copies landed
 * @run MUTANT_POST_BEFORE_COPY    safety         assert
 *        the post stored before the copy completes: an own tile reads the rows of the call before
 * @run MUTANT_NO_READY_RESET      safety         assert
 *        the gate leaves the ready count as it is: the next call's gate passes before the GEMM stored the rows, and
 *        the copy carries the rows of the call before
 * @run MUTANT_LOW_TARGET          safety         assert
 *        the gate waits for one count a chunk where each warp stores and counts its own rows: the copy carries a
 *        chunk that a warp has not stored yet (a target below the warps and tiles of a chunk)
 * @run MUTANT_FORK_AFTER_GEMM     safety         deadlock
 *        the side stream forked after the GEMM's launch: it waits for the GEMM to end, which waits for the peers'
 *        posts, which wait for their own GEMMs' ends
 */

#define RANKS 3     /* at least 3: a rank receives from two peers, one of which may be a call ahead */
#define CALLS 3     /* back-to-back calls (or replays) of every rank */
#define SLOTS 2     /* RANKS - 1: a received block, a products block and their words for each peer */
#define CHUNKS 2    /* the chunks of a block (sm90_engine_chunks): a gate, a copy and a post each */
#define WARPS 2     /* the counts of a chunk: the gate's target (sm90_engine_ready_target) */
#define TILES (SLOTS * CHUNKS * WARPS)   /* the peer tiles of a call: a warp's rows of a chunk each */
#ifdef MUTANT_LOW_TARGET
#define TARGET 1
#else
#define TARGET WARPS
#endif

/* The peer `destination` places after r (0: r + 1), and the slot of `receiver`'s area that `sender` writes
 * (ExchangeView::slot_of, copy_engine_rows). */
#define peer_of(r, destination) (((r) + 1 + (destination)) % RANKS)
#define slot_of(sender, receiver) (((sender) - (receiver) - 1 + RANKS) % RANKS)
/* r's received block from slot s, chunk c, and its arrived flag. */
#define at(r, s, c) (((r) * SLOTS + (s)) * CHUNKS + (c))
/* The side stream's step i: destination i / CHUNKS, chunk i % CHUNKS (destinations in order, chunks in order); the
 * products' chunk i (warp w's part: i * WARPS + w) and its ready count i. */
#define dest_of(i) ((i) / CHUNKS)
#define chunk_of(i) ((i) % CHUNKS)
#define block_of(r, i) at(peer_of(r, dest_of(i)), slot_of(r, peer_of(r, dest_of(i))), chunk_of(i))

byte received[RANKS * SLOTS * CHUNKS];  /* the tag of the rows in r's received block, as r reads them */
bit arrived[RANKS * SLOTS * CHUNKS];    /* r's arrived flags: set by the sender's post, reset by r's last block */
bit reading[RANKS * SLOTS * CHUNKS];    /* r's own tile reads that block now */
byte met[RANKS];                        /* the calls whose entry meeting r has started */
byte finished;                          /* ranks done with every call */

/* An own tile of chunk c: lane 0 waits until every slot's arrived flag is set (acquire), then the warp reads every
 * slot's rows (the first as C); the reads take time, so they are two steps: a copy landing between them is seen. */
#define OWN_TILE(c) \
  :: !ended && !(started & (1 << (c))) && arrived[at(r, 0, c)] && arrived[at(r, 1, c)] -> \
     atomic { started = started | (1 << (c)); \
              reading[at(r, 0, c)] = 1; assert(received[at(r, 0, c)] == call + 1); \
              reading[at(r, 1, c)] = 1; assert(received[at(r, 1, c)] == call + 1) } \
  :: (started & (1 << (c))) && !(read & (1 << (c))) -> \
     atomic { assert(received[at(r, 0, c)] == call + 1); reading[at(r, 0, c)] = 0; \
              assert(received[at(r, 1, c)] == call + 1); reading[at(r, 1, c)] = 0; \
              read = read | (1 << (c)) }

proctype Rank(byte r) {
  /* this rank's products for each destination (the tag of the call whose GEMM stored a warp's part of a chunk) and
   * their ready counts (a count a warp, reset by the gate); only this rank's GEMM and side stream use them */
  byte products[SLOTS * CHUNKS * WARPS], ready[SLOTS * CHUNKS];
  /* the caller's stream: its call; the GEMM's peer tiles stored and counted, own chunks started and read; ended:
   * the GEMM of this call has ended (its last block has reset the arrived flags) */
  byte call = 0, tiles, started, read;
  bool ended;
  /* the side stream: the calls whose work it has completed; step 0: not forked yet, 1: in the entry meeting (then
   * at the first gate), 2: at the gate of step i, 3: the copy of step i in flight (to block, carrying `carried`) */
  byte side = 0, step, i, block, carried;

  do
  /* the GEMM's peer tiles, in the order the gates take them (destinations, chunks, warps) */
  :: !ended && tiles < TILES ->
     atomic { products[tiles] = call + 1; ready[tiles / WARPS]++; tiles++ }   /* stored, fenced, then counted */
  /* its own tiles, at any time among them */
  OWN_TILE(0)
  OWN_TILE(1)
  /* finish_exchange: the last block resets the arrived flags (every own tile has seen them), then stores the stamp
   * as the call count and into the peers' freed words (left out) */
  :: !ended && tiles == TILES && read == 3 ->
     atomic {
#ifndef MUTANT_NO_ARRIVED_RESET
       arrived[at(r, 0, 0)] = 0; arrived[at(r, 0, 1)] = 0; arrived[at(r, 1, 0)] = 0; arrived[at(r, 1, 1)] = 0;
#endif
       ended = 1
     }
  /* follow(stream, side): the call ends once its side's work has completed; the next call forks its side stream */
  :: ended && side == call + 1 && call + 1 < CALLS ->
     atomic { call++; ended = 0; tiles = 0; started = 0; read = 0 }
  :: ended && side == CALLS -> break

  /* the side stream, forked from the caller's stream before the GEMM's launch: it starts once the caller's stream
   * has reached this call (the call before has ended) */
#ifdef MUTANT_FORK_AFTER_GEMM
  :: step == 0 && side == call && side < CALLS && ended ->   /* forked after the launch: after the GEMM's end */
#else
  :: step == 0 && side == call && side < CALLS ->
#endif
#ifdef MUTANT_NO_ENTRY_MEETING
     step = 2
#else
     atomic { met[r] = side + 1; step = 1 }                   /* the entry meeting starts */
#endif
  /* the entry meeting completes once every rank has started it (its call before has ended); then engine_gate:
   * every count of the chunk is in (acquire), then the next call counts from 0; then the copy starts: it reads the
   * products' chunk, and writes the peer's received block until it lands. (The meeting's completion changes nothing
   * another rank sees, and stays complete: it is taken with the first gate.) */
  :: (step == 2 || (step == 1 && met[0] > side && met[1] > side && met[2] > side)) && ready[i] >= TARGET ->
     atomic {
       assert(tiles >= (i + 1) * WARPS);      /* the count is this call's: its GEMM has stored the whole chunk */
#ifndef MUTANT_NO_READY_RESET
       ready[i] = 0;
#endif
       block = block_of(r, i);
       assert(reading[block] == 0);           /* the peer no longer reads what this copy replaces */
       if
       :: products[i * WARPS] == products[i * WARPS + 1] -> carried = products[i * WARPS]
       :: else -> carried = 0                 /* a torn chunk: rows of two calls */
       fi;
#ifdef MUTANT_POST_BEFORE_COPY
       assert(arrived[block] == 0);
       arrived[block] = 1;
#endif
       step = 3
     }
  /* the copy lands (weakly ordered: at any time until it completes) and completes; then engine_post: a system
   * fence and a release store of 1 into the peer's arrived flag */
  :: step == 3 ->
     atomic {
       assert(reading[block] == 0);
       received[block] = carried;
#ifndef MUTANT_POST_BEFORE_COPY
       assert(arrived[block] == 0);           /* the peer's flag of the call before has been reset */
       arrived[block] = 1;
#endif
       carried = 0; block = 0;
       if
       :: i + 1 < SLOTS * CHUNKS -> i++; step = 2
       :: else -> i = 0; step = 0; side++     /* the side's work of this call has completed */
       fi
     }
  od;
  finished++
}

init {
  atomic { run Rank(0); run Rank(1); run Rank(2) }
}

ltl all_finish { <> (finished == RANKS) }
