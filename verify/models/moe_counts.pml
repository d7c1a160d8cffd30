/* MoE expert-major dispatch and combine: the tagged count exchange, the two parities of the count matrix, and
 * the reuse of the receive rows, records and combine area across back-to-back calls.
 *
 * Models (file:function), the expert-major path (the rank-major and line paths are not modelled):
 *   src/moe/moe_dispatch.cu: moe_route (start_dependent_kernel first; each block stores its count, tagged with
 *     the dispatch number, into count_row(owner, epoch & 1, me) of every rank, one relaxed 8-byte store;
 *     combine_plan[3] = combine_plan[2], combine_plan[2] = 1)
 *   src/moe/moe_dispatch.cu: moe_scatter (entry barrier when combine_plan[3] != 0; advance_once_read of the
 *     epoch; acquire waits until every word of count_matrix(epoch & 1) carries count_tag_of(epoch); compute_layout
 *     reads them again; send_tokens into the peers' rows and records; signal (release) to every peer; wait for
 *     every peer; expand_tokens from this rank's rows and records)
 *   src/moe/moe_combine.cu: moe_combine_send (entry barrier unless combine_plan[2] != 0, "implied when a dispatch
 *     came in between"; send_partials reads this rank's records and stores partials into the source's combine
 *     area; exit barrier), moe_combine_reduce (start_dependent_kernel; combine_plan[2] = 0; reduce_partials reads
 *     this rank's combine area)
 *   src/moe/moe_layout.cuh: count_tag_of, count_value, count_matrix, count_row, compute_layout
 *   src/kernels/launch_counter.cuh: read_launch_counter, advance_once_read (the epoch, device memory)
 *   include/braid/device/sync_device.hpp: barrier, signal, wait (one channel: block b of every rank)
 *
 * Each rank is a process making the same program of calls (D: a dispatch, route then scatter; C: a combine,
 * send then reduce), as every rank must. One block a kernel: every block of a kernel waits for every count word
 * and the same block of every peer, so blocks add nothing the model checks. One count word per (owner, parity,
 * source): the E + W words a source stores into an owner are stored alike and waited for alike. A kernel that
 * starts waits for the kernel before it on its rank to have ended (griddepcontrol.wait in start_dependent_kernel
 * is the first thing route, combine_send and combine_reduce do; scatter's first reads of shared state follow
 * its own griddepcontrol.wait): the steps of a rank are sequential.
 *
 * Weak ordering: a store to a peer (count word, row, partial) goes to a pending buffer of its writer that the
 * Memory process lands at any time, in any order; signal()'s release lands the writer's pending rows and
 * partials first (the route's count stores are never released: the tag travels in the word). An older store to
 * a word lands before a newer one (coherence). A rank's stores into its own memory are read by its own later
 * kernels only, after a kernel boundary: they land at once.
 *
 * NOTE [reduced widths]
 *   The real tag is the low 16 bits of epoch + 1 (count_tag_of); here TAG_MOD = 4 (2 bits). Faithful: the
 *   dispatch of epoch e reads parity e & 1, whose words hold e's tag or that of e - 2 (the last dispatch of that
 *   parity, which this rank waited out completely before it started e - 1), never an older one. Tags of e and
 *   e - 2 differ for every width of at least 2 bits, and the wait compares for equality. The epoch starts at
 *   EPOCH_START = 2 with the matrix as two dispatches left it (parity 0 holds epoch 0's tag, parity 1 epoch 1's),
 *   so the three dispatches of DISPATCHES (epochs 2, 3, 4: tags 3, 0, 1) wrap the tag. Signal counters are exact
 *   (a handful of signals; signal_barrier.pml covers their wrap-around).
 *
 * Which dispatches move rows is chosen at the start, every combination, the same on every rank (every rank plans
 * the rounds from the same counts): a dispatch with plan.rounds == 0 (no tokens anywhere) sends, signals and
 * waits for nothing, as a scatter block past plan.active_blocks does, so only the count exchange orders it; the
 * combine after it has no block with work (combine_plan[0] == 0) and passes no barrier.
 *
 * NOTE [the dispatch barrier]
 *   Scatter's entry barrier after a dispatch (combine_plan[3] != 0) is implied, as combine says of its own entry
 *   barrier after a dispatch: a peer's route of the next dispatch stores its counts only after its scatter of
 *   the last one has ended (start_dependent_kernel is route's first step), and this rank's scatter stores no row
 *   before it has seen those counts. Run dispatch_barrier_implied leaves the barrier out and every property
 *   holds. Not a bug: a barrier round trip per dispatch after a dispatch that could go, if route keeps its
 *   griddepcontrol.wait ahead of the count stores (not measured).
 *
 * Programs (one a run): default LAYER = D C D C D C (an MoE layer three times: counts of dispatches 1 and 3 share
 * a parity, every combine skips its entry barrier); -DDISPATCHES = D D D (back-to-back dispatches: scatter's entry
 * barrier, parity reuse and the tag's wrap); -DCOMBINES = D C C D C (two combines in a row: combine's entry
 * barrier; a dispatch after a combine skips scatter's barrier).
 *
 * Properties:
 *   - a receiver reads a count only once its writer's word for this dispatch is visible (the assert after the
 *     tag wait, where compute_layout reads the counts: every count is this dispatch's), and rows, records and
 *     partials only once the writer's stores for this call are (the asserts of expand_tokens, send_partials's
 *     record reads and reduce_partials);
 *   - no store lands in a count word its owner is waiting for or reading for another dispatch, nor in rows,
 *     records or a combine area its owner is reading (asserts in land_tag, land_val, land_rows, land_partials);
 *   - no deadlock (invalid end states).
 *
 * @run real                          safety pass
 * @run real_dispatches               safety pass   -DDISPATCHES
 * @run real_combines                 safety pass   -DCOMBINES
 * @run dispatch_barrier_implied      safety pass   -DDISPATCHES -DSKIP_DISPATCH_BARRIER
 *        scatter's entry barrier left out (dispatch after dispatch): every property still holds (NOTE [the
 *        dispatch barrier])
 * @run MUTANT_EPOCH_NOT_ADVANCED     safety assert -DDISPATCHES
 *        the epoch (advance_once_read) not advanced: every dispatch has the same tag and parity, so a dispatch
 *        takes the last one's counts as its own
 * @run MUTANT_ONE_PARITY             safety assert -DDISPATCHES
 *        one count matrix (parity 0 always): a fast rank's next route overwrites counts a slow rank still waits
 *        for or reads
 * @run MUTANT_TAG_APART              safety assert -DDISPATCHES
 *        the tag stored as a flag word of its own beside the count, both relaxed: the flag lands before the count
 * @run MUTANT_ROWS_RELAXED           safety assert
 *        scatter's signal a relaxed add: it lands before the rows and records it announces
 * @run MUTANT_NO_COMBINE_ENTRY       safety assert -DCOMBINES
 *        combine skips its entry barrier after a combine too: a fast rank's partials land in a combine area
 *        its peer still reduces
 * @run MUTANT_PLAN_NOT_CLEARED       safety assert -DCOMBINES
 *        combine_plan[2] ("a dispatch since the last combine") not cleared by the reduce: the second of two
 *        combines skips its entry barrier
 */

#define RANKS 3
#define TAG_MOD 4           /* reduced from 2^16: NOTE [reduced widths] */
#define EPOCH_START 2       /* dispatches before the first call: NOTE [reduced widths] */

#define D 1
#define C 2
#if defined(DISPATCHES)
#define NOPS 3
#define NDISPATCH 3
#define PROGRAM prog[0] = D; prog[1] = D; prog[2] = D
#elif defined(COMBINES)
#define NOPS 5
#define NDISPATCH 2
#define PROGRAM prog[0] = D; prog[1] = C; prog[2] = C; prog[3] = D; prog[4] = C
#else
#define NOPS 6
#define NDISPATCH 3
#define PROGRAM prog[0] = D; prog[1] = C; prog[2] = D; prog[3] = C; prog[4] = D; prog[5] = C
#endif

#define tag_of(epoch) (((epoch) + 1) % TAG_MOD)          /* count_tag_of */
#ifdef MUTANT_ONE_PARITY
#define parity_of(epoch) 0
#else
#define parity_of(epoch) ((epoch) & 1)
#endif

#define at(o, s) ((o) * RANKS + (s))                      /* owner o's slot for source s */
#define word(o, p, s) (((o) * 2 + (p)) * RANKS + (s))     /* count word of source s in owner o's parity p */
#define WORDS (RANKS * 2 * RANKS)
#define peer_of(r, k) (((r) + (k)) % RANKS)

byte prog[NOPS];
bool moves[NDISPATCH + 1];   /* moves[n]: dispatch n moves rows (plan.rounds > 0), the same on every rank */

/* The count matrix, as its owner sees it: tag and count of each word (the count is a ghost: the number of the
   dispatch, from 1, that stored it; 0 for the dispatches before the first call). One word: they land together. */
byte cnt_tag[WORDS], cnt_val[WORDS];
byte pend_tag[WORDS], pend_val[WORDS];
bool has_tag[WORDS], has_val[WORDS];   /* a store of the tag / count that has not landed */
byte counts_in_use[RANKS * 2];         /* owner o waits for / reads parity p for dispatch n (0: not) */

/* Rows and records of dispatch n from source s in owner o (the ghost n), and combine n's partials. */
byte rows[RANKS * RANKS], pend_rows[RANKS * RANKS];
bool has_rows[RANKS * RANKS];
byte partials[RANKS * RANKS], pend_partials[RANKS * RANKS];
bool has_partials[RANKS * RANKS];
bool rows_in_use[RANKS], partials_in_use[RANKS];

byte sig[RANKS * RANKS];               /* sig[at(o, s)]: signals s sent o on the channel (exact) */

/* Landing. A count word may land in a parity its owner waits for or reads only if it is that dispatch's. */
inline land_tag(i) {
  assert(counts_in_use[i / RANKS] == 0 || counts_in_use[i / RANKS] == pend_val[i]);
  cnt_tag[i] = pend_tag[i]; has_tag[i] = 0
}
inline land_val(i) {
  assert(counts_in_use[i / RANKS] == 0 || counts_in_use[i / RANKS] == pend_val[i]);
  cnt_val[i] = pend_val[i]; has_val[i] = 0
}
inline land_rows(i) { assert(!rows_in_use[i / RANKS]); rows[i] = pend_rows[i]; has_rows[i] = 0 }
inline land_partials(i) { assert(!partials_in_use[i / RANKS]); partials[i] = pend_partials[i]; has_partials[i] = 0 }

/* moe_route's store into owner o: one relaxed 8-byte word (tag and count), or two under MUTANT_TAG_APART. */
inline store_count(o, p, n, t) {
  if :: has_tag[word(o, p, r)] -> land_tag(word(o, p, r)) :: else -> skip fi;
  if :: has_val[word(o, p, r)] -> land_val(word(o, p, r)) :: else -> skip fi;
  pend_tag[word(o, p, r)] = t; pend_val[word(o, p, r)] = n;
  has_tag[word(o, p, r)] = 1; has_val[word(o, p, r)] = 1
}

/* signal()'s release: the writer's rows, records and partials land first. */
inline release() {
  j = 1;
  do
  :: j < RANKS ->
     if :: has_rows[at(peer_of(r, j), r)] -> land_rows(at(peer_of(r, j), r)) :: else -> skip fi;
     if :: has_partials[at(peer_of(r, j), r)] -> land_partials(at(peer_of(r, j), r)) :: else -> skip fi;
     j++
  :: else -> break
  od
}

inline signal_peers(releases) {
  atomic {
    if :: releases -> release() :: else -> skip fi;
    sig[at(peer_of(r, 1), r)]++; sig[at(peer_of(r, 2), r)]++
  }
}

/* wait(): ld.acquire until the peer's counter reaches expected + 1 (expected in device memory). */
inline wait_peers() {
  atomic {
    sig[at(r, peer_of(r, 1))] > expected[peer_of(r, 1)] && sig[at(r, peer_of(r, 2))] > expected[peer_of(r, 2)] ->
    expected[peer_of(r, 1)]++; expected[peer_of(r, 2)]++
  }
}

inline barrier() { signal_peers(true); wait_peers() }

#define tag_seen(p, s) (cnt_tag[word(r, p, s)] == t)   /* t: the tag of the epoch read at the start */

proctype Rank(byte r) {
  byte op = 0, n = 0, combine = 0, last_dispatch = 0, epoch = EPOCH_START, p, t, j;
  byte expected[RANKS];
  bool plan2 = 0, plan3 = 0;    /* combine_plan[2] (a dispatch since the last combine), [3] (last call a dispatch) */
  do
  :: op < NOPS && prog[op] == D ->
     n++;
     /* moe_route: after the last kernel has ended; the tagged count into every rank */
     p = parity_of(epoch); t = tag_of(epoch);
     atomic {
       store_count(peer_of(r, 1), p, n, t);
       store_count(peer_of(r, 2), p, n, t);
       cnt_tag[word(r, p, r)] = t; cnt_val[word(r, p, r)] = n;   /* its own matrix: read after the kernel ends */
       plan3 = plan2; plan2 = 1
     }
     /* moe_scatter */
#ifdef SKIP_DISPATCH_BARRIER
     skip;
#else
     if :: plan3 -> barrier() :: else -> skip fi;
#endif
#ifndef MUTANT_EPOCH_NOT_ADVANCED
     epoch++;                   /* advance_once_read: the next launch reads it */
#endif
     counts_in_use[r * 2 + p] = n;
     atomic { tag_seen(p, 0) && tag_seen(p, 1) && tag_seen(p, 2) -> skip }   /* load_acquire_system until tagged */
     atomic {                   /* compute_layout reads the counts */
       assert(cnt_val[word(r, p, 0)] == n && cnt_val[word(r, p, 1)] == n && cnt_val[word(r, p, 2)] == n);
       counts_in_use[r * 2 + p] = 0
     }
     if
     :: moves[n] ->
     atomic {                   /* send_tokens into every peer: rows and records */
       j = 1;
       do
       :: j < RANKS ->
          if :: has_rows[at(peer_of(r, j), r)] -> land_rows(at(peer_of(r, j), r)) :: else -> skip fi;
          pend_rows[at(peer_of(r, j), r)] = n; has_rows[at(peer_of(r, j), r)] = 1;
          j++
       :: else -> break
       od
     }
#ifdef MUTANT_ROWS_RELAXED
     signal_peers(false);
#else
     signal_peers(true);
#endif
     wait_peers();
     atomic { rows_in_use[r] = 1; assert(rows[at(r, peer_of(r, 1))] == n && rows[at(r, peer_of(r, 2))] == n) }
     rows_in_use[r] = 0         /* expand_tokens done; write_outputs is local */
     :: else -> skip            /* plan.rounds == 0: no block sends, signals or waits */
     fi;
     last_dispatch = n;
     op++
  :: op < NOPS && prog[op] == C ->
     combine++;
     /* moe_combine_send: no block has work when the last dispatch moved no rows (combine_plan[0] == 0), and then
        none passes a barrier either */
     if
     :: moves[last_dispatch] ->
#ifdef MUTANT_NO_COMBINE_ENTRY
     skip;
#else
     if :: !plan2 -> barrier() :: else -> skip fi;
#endif
     atomic {                   /* send_partials reads this rank's records, the rows they name */
       rows_in_use[r] = 1;
       assert(rows[at(r, peer_of(r, 1))] == last_dispatch && rows[at(r, peer_of(r, 2))] == last_dispatch)
     }
     atomic {                   /* and stores a partial into each source */
       rows_in_use[r] = 0;
       j = 1;
       do
       :: j < RANKS ->
          if :: has_partials[at(peer_of(r, j), r)] -> land_partials(at(peer_of(r, j), r)) :: else -> skip fi;
          pend_partials[at(peer_of(r, j), r)] = combine; has_partials[at(peer_of(r, j), r)] = 1;
          j++
       :: else -> break
       od
     }
     barrier();                 /* exit barrier */
     /* moe_combine_reduce */
     atomic {
       partials_in_use[r] = 1;
       assert(partials[at(r, peer_of(r, 1))] == combine && partials[at(r, peer_of(r, 2))] == combine)
     }
     partials_in_use[r] = 0
     :: else -> skip
     fi;
#ifndef MUTANT_PLAN_NOT_CLEARED
     plan2 = 0;                 /* moe_combine_reduce, after send has ended */
#endif
     op++
  :: op == NOPS -> break
  od
}

/* Lands one pending store, any of them, at any time; blocked while none is pending. */
#ifdef MUTANT_TAG_APART
#define land_count(i) :: atomic { has_tag[i] -> land_tag(i) } :: atomic { has_val[i] -> land_val(i) }
#else
#define land_count(i) :: atomic { has_tag[i] -> land_tag(i); land_val(i) }
#endif
#define land_slot(i) :: atomic { has_rows[i] -> land_rows(i) } :: atomic { has_partials[i] -> land_partials(i) }
#define land_owner(o) land_count(word(o, 0, 0)) land_count(word(o, 0, 1)) land_count(word(o, 0, 2)) \
                      land_count(word(o, 1, 0)) land_count(word(o, 1, 1)) land_count(word(o, 1, 2)) \
                      land_slot(at(o, 0)) land_slot(at(o, 1)) land_slot(at(o, 2))
active proctype Memory() {
end:
  do
  land_owner(0) land_owner(1) land_owner(2)
  od
}

init {
  byte o, p, s;
  atomic {
    PROGRAM;
    o = 1;
    do   /* which dispatches move rows: every combination */
    :: o <= NDISPATCH -> if :: moves[o] = 1 :: moves[o] = 0 fi; o++
    :: else -> break
    od;
    o = 0;
    do
    :: o < RANKS ->
       p = 0;
       do
       :: p < 2 ->
          s = 0;
          do :: s < RANKS -> cnt_tag[word(o, p, s)] = tag_of(EPOCH_START - 2 + p); s++ :: else -> break od;
          p++
       :: else -> break
       od;
       o++
    :: else -> break
    od;
    run Rank(0); run Rank(1); run Rank(2)
  }
}
