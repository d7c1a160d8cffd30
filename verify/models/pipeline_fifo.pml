/* The pipeline's FIFOs: pieces pushed into a peer's slots, handed back with credits, across back-to-back calls.
 *
 * Models (file:function):
 *   src/kernels/pipeline.cuh: wait_peers, post_peers, fifo_slot, fifo_piece, ChainLink::wait, ChainLink::post
 *     (one channel, one phase)
 *   src/kernels/reduce_scatter.cu: reduce_scatter (every rank to every rank; the scatter of round + 1 goes
 *     out before the wait for round's pieces)
 *   src/kernels/broadcast_chain.cu: broadcast_chain (-DCHAIN: root 0 -> 1 -> 2; no piece flows back, so the
 *     credits alone hold a fast sender back)
 *   src/sync/device_sync.cpp: DeviceSync::grant_credits (expected free counts start kFifoDepth below zero;
 *     src/comm/communicator.cpp grants them once, at init)
 *   include/braid/device/sync_device.hpp: signal, wait, reached (as in signal_barrier.pml)
 *
 * Each rank is a process running CALLS calls of ROUNDS rounds. A sender waits for a credit (a free count) of
 * the receiver, stores its piece into the receiver's FIFO slot and posts a data count; the receiver waits for
 * the data count, loads the piece and posts a free count. One FIFO per (sender, receiver) pair of SLOTS slots;
 * the n-th piece lives in slot (n - 1) mod SLOTS on both sides, from the counts. Counters and expected counts
 * live across calls (device memory), so a call of this model is an eager call and a graph replay alike.
 *
 * Weak ordering: piece stores go to a pending buffer that the Memory process lands in any order at any time;
 * signal()'s release lands the rank's pending stores first. A store that lands while the receiver still loads
 * that slot is an overwrite (assert in land).
 *
 * NOTE [reduced widths]
 *   The real counters are 64-bit, compared by difference (reached), and the expected free counts start
 *   kFifoDepth below zero, so they wrap at once; the slot is count mod kFifoDepth. Here counters count modulo
 *   COUNTER_MOD = 2^COUNTER_BITS. Faithful while (a) COUNTER_MOD is a multiple of SLOTS, so count mod SLOTS is
 *   the real slot, and (b) the distance between a counter and the target a wait compares it with stays in
 *   [-COUNTER_MOD/2, COUNTER_MOD/2): a sender is at most CREDITS pieces ahead of the frees it has seen and a
 *   receiver at most one piece behind, so both distances are in [-1, CREDITS - 1] = [-1, 3], inside [-4, 4) for
 *   COUNTER_BITS 3. Counters start at COUNTER_START (a pad that carried that many pieces, every rank at rest) so
 *   that the CALLS x ROUNDS pieces of a FIFO wrap them, and CALLS x ROUNDS exceeds SLOTS so that slots are
 *   reused. The mutants that move a count further than that (more credits, counts reset) take COUNTER_BITS 4,
 *   so that what they break is the protocol and not the model's width.
 *
 * Properties:
 *   - a receiver loads a slot only once the sender's piece for it is visible (assert in load_piece);
 *   - no piece lands in a slot while its receiver still loads the piece before it (assert in land);
 *   - no deadlock (invalid end states); every rank finishes every call (ltl all_finish, weak fairness).
 *
 * @run real                        safety         pass
 * @run real_progress               ltl:all_finish pass
 * @run real_chain                  safety         pass   -DCHAIN
 * @run real_chain_progress         ltl:all_finish pass   -DCHAIN
 * @run MUTANT_NO_CREDIT_WAIT       safety         assert -DCHAIN
 *        the sender skips the wait for a free slot and counts its pieces itself
 * @run MUTANT_FREE_BEFORE_LOAD     safety         assert -DCHAIN
 *        the receiver hands the slot back before it has loaded the piece
 * @run MUTANT_DATA_RELAXED         safety         assert
 *        the data count posted with a relaxed add: it lands before the piece's stores
 * @run MUTANT_EXTRA_CREDIT         safety         assert -DCHAIN
 *        credits granted for SLOTS + 1 pieces: a slot is reused one piece early
 * @run MUTANT_EXPECTED_PER_LAUNCH  safety         assert -DCHAIN
 *        expected counts kept by the launch (reset every call) instead of in device memory
 * @run MUTANT_SLOT_FROM_ROUND      safety         assert
 *        the slot taken from the launch's round (round mod SLOTS) instead of the count
 */

#define RANKS 3             /* at least 3: a chain has a rank that both receives and forwards */
#define CALLS 3             /* back-to-back calls (or replays) of every rank */
#define ROUNDS 2            /* pieces a call sends to each peer: CALLS x ROUNDS > SLOTS reuses every slot */
#define SLOTS 4             /* faithful to kFifoDepth (pipeline_launch.hpp) */
#define CREDIT_WINDOW 4     /* the largest distance between a counter and its target, plus one: NOTE [reduced widths] */

#if defined(MUTANT_EXTRA_CREDIT) || defined(MUTANT_EXPECTED_PER_LAUNCH)
#define COUNTER_BITS 4
#define COUNTER_MOD 16
#else
#define COUNTER_BITS 3      /* reduced from 64: NOTE [reduced widths] */
#define COUNTER_MOD 8       /* 1 << COUNTER_BITS */
#endif
#define COUNTER_START (COUNTER_MOD - 3)   /* pieces carried before the first call: the counters wrap */

#ifdef MUTANT_EXTRA_CREDIT
#define CREDITS (SLOTS + 1)
#else
#define CREDITS SLOTS       /* grant_credits(..., kFifoDepth) */
#endif

#ifdef MUTANT_DATA_RELAXED
#define DATA_RELEASES false
#else
#define DATA_RELEASES true  /* post_peers: signal() is a release add */
#endif

#define at(r, p) ((r) * RANKS + (p))
#define slot_of(receiver, sender, s) (at(receiver, sender) * SLOTS + (s))
#define peer_of(r, k) (((r) + (k)) % RANKS)
#define plus_one(count) (((count) + 1) % COUNTER_MOD)
#define fifo_slot(count) (((count) + COUNTER_MOD - 1) % SLOTS)
#define REACHED(value, target) ((((value) + COUNTER_MOD - (target)) % COUNTER_MOD) < COUNTER_MOD / 2)
#define ENTRIES (RANKS * RANKS * SLOTS)

byte data[RANKS * RANKS];   /* data[at(r, p)]: pieces p posted to r (r's pad, set kData1) */
byte freed[RANKS * RANKS];  /* freed[at(r, p)]: slots p handed back to r (r's pad, set kFree1) */
byte fifo[ENTRIES];         /* fifo[slot_of(r, p, s)]: the piece (its number from 1) in r's FIFO from p, as r sees it */
byte pending[ENTRIES];      /* a piece store of p into that slot that has not landed (0: none) */
bool loading[ENTRIES];      /* r is loading that slot now */
byte finished;

/* A store lands: it must not rewrite a slot its receiver is still loading. */
inline land(i) {
  assert(!loading[i]);
  fifo[i] = pending[i];
  pending[i] = 0
}

/* An older store to the same slot lands before a newer one (coherence). */
inline land_if_pending(i) {
  if :: pending[i] != 0 -> land(i) :: else -> skip fi
}

/* Lands every pending piece store of `sender` (the release half of signal). */
inline land_stores_of(sender) {
  j = 0;
  do
  :: j < ENTRIES ->
     if :: pending[j] != 0 && (j / SLOTS) % RANKS == sender -> land(j) :: else -> skip fi;
     j++
  :: else -> j = 0; break
  od
}

/* The sender's store of its next piece for `receiver` into slot `s` of the receiver's FIFO from it: relaxed,
   landing later. */
inline store_piece(receiver, s) {
  sent[receiver]++;
  land_if_pending(slot_of(receiver, r, s));
  pending[slot_of(receiver, r, s)] = sent[receiver]
}

/* The receiver's loads of the next piece of `sender`, from slot `s`; done_loading ends them. */
inline load_piece(sender, s) {
  received[sender]++;
  loading[slot_of(r, sender, s)] = 1;
  assert(fifo[slot_of(r, sender, s)] == received[sender])
}
#define done_loading(sender, s) loading[slot_of(r, sender, s)] = 0

/* The count a wait reaches, and the slot it names. A wait for several counters that only grow passes
   exactly when the separate waits of the block's threads would, so a round's waits are one guard. */
#define wait_target(expected, p) plus_one(expected[p])
#define passed_wait(expected, p, slots) expected[p] = plus_one(expected[p]); slots[p] = fifo_slot(expected[p])

#ifdef MUTANT_NO_CREDIT_WAIT
#define credit_ready(p) true
#define take_credit(p) own[p] = plus_one(own[p]); push_slot[p] = fifo_slot(own[p])
#else
#define credit_ready(p) REACHED(freed[at(r, p)], wait_target(expected_free, p))
#define take_credit(p) passed_wait(expected_free, p, push_slot)
#endif
#define data_ready(p) REACHED(data[at(r, p)], wait_target(expected_data, p))
#define take_data(p) passed_wait(expected_data, p, pull_slot)

#ifdef MUTANT_SLOT_FROM_ROUND
#define slot_override(slots, p, round) slots[p] = (round) % SLOTS
#else
#define slot_override(slots, p, round) skip
#endif

/* Expected counts as DeviceSync leaves them: data at the counters, free counts CREDITS below them. */
inline start_expected_counts() {
  k = 0;
  do
  :: k < RANKS ->
     expected_data[k] = COUNTER_START;
     expected_free[k] = (COUNTER_START + COUNTER_MOD - CREDITS) % COUNTER_MOD;
     own[k] = COUNTER_START;
     k++
  :: else -> k = 0; break
  od
}

#define RANK_STATE \
  byte call = 0, round, k, j; \
  byte expected_data[RANKS], expected_free[RANKS]; /* pad.expected: device memory, kept across calls */ \
  byte push_slot[RANKS], pull_slot[RANKS]; \
  byte sent[RANKS], received[RANKS];               /* pieces sent to / received from each peer so far */ \
  byte own[RANKS]                                  /* MUTANT_NO_CREDIT_WAIT: the sender's own piece count */

#ifndef CHAIN
/* reduce_scatter: scatter(round) = credits of every peer, a piece into each, a data count to each. */
inline scatter(round) {
  atomic { credit_ready(peer_of(r, 1)) && credit_ready(peer_of(r, 2)) ->
           take_credit(peer_of(r, 1)); take_credit(peer_of(r, 2)) }
  slot_override(push_slot, peer_of(r, 1), round); slot_override(push_slot, peer_of(r, 2), round);
  atomic { store_piece(peer_of(r, 1), push_slot[peer_of(r, 1)]); store_piece(peer_of(r, 2), push_slot[peer_of(r, 2)]) }
  atomic {   /* post_peers(kData1) */
    if :: DATA_RELEASES -> land_stores_of(r) :: else -> skip fi;
    data[at(peer_of(r, 1), r)] = plus_one(data[at(peer_of(r, 1), r)]);
    data[at(peer_of(r, 2), r)] = plus_one(data[at(peer_of(r, 2), r)])
  }
}

proctype Rank(byte r) {
  RANK_STATE;
  start_expected_counts();
  do
  :: call < CALLS ->
#ifdef MUTANT_EXPECTED_PER_LAUNCH
     start_expected_counts();
#endif
     round = 0;
     scatter(0);
     do
     :: round < ROUNDS ->
        if :: round + 1 < ROUNDS -> scatter(round + 1) :: else -> skip fi;
        atomic { data_ready(peer_of(r, 1)) && data_ready(peer_of(r, 2)) ->
                 take_data(peer_of(r, 1)); take_data(peer_of(r, 2)) }
        slot_override(pull_slot, peer_of(r, 1), round); slot_override(pull_slot, peer_of(r, 2), round);
#ifdef MUTANT_FREE_BEFORE_LOAD
        atomic { land_stores_of(r);
                 freed[at(peer_of(r, 1), r)] = plus_one(freed[at(peer_of(r, 1), r)]);
                 freed[at(peer_of(r, 2), r)] = plus_one(freed[at(peer_of(r, 2), r)]) }
#endif
        atomic { load_piece(peer_of(r, 1), pull_slot[peer_of(r, 1)]); load_piece(peer_of(r, 2), pull_slot[peer_of(r, 2)]) }
        atomic {   /* the reduction is done; post_peers(kFree1) */
          done_loading(peer_of(r, 1), pull_slot[peer_of(r, 1)]);
          done_loading(peer_of(r, 2), pull_slot[peer_of(r, 2)]);
#ifndef MUTANT_FREE_BEFORE_LOAD
          land_stores_of(r);
          freed[at(peer_of(r, 1), r)] = plus_one(freed[at(peer_of(r, 1), r)]);
          freed[at(peer_of(r, 2), r)] = plus_one(freed[at(peer_of(r, 2), r)])
#endif
        }
        round++
     :: else -> break
     od;
     call++
  :: else -> break
  od;
  finished++
}
#else
/* broadcast_chain from root 0: rank r receives from r - 1 (r > 0) and forwards to r + 1 (r < RANKS - 1). */
#define previous (r - 1)
#define next (r + 1)
#define receives (r > 0)
#define forwards (r < RANKS - 1)

proctype Rank(byte r) {
  RANK_STATE;
  start_expected_counts();
  do
  :: call < CALLS ->
#ifdef MUTANT_EXPECTED_PER_LAUNCH
     start_expected_counts();
#endif
     round = 0;
     do
     :: round < ROUNDS ->
        /* ChainLink::wait: the data thread waits for the previous rank's piece, the credit thread for a slot
           of the next rank's FIFO, then the block's barrier */
        atomic {
          (!receives || data_ready(previous)) && (!forwards || credit_ready(next)) ->
          if :: receives -> take_data(previous); slot_override(pull_slot, previous, round) :: else -> skip fi;
          if :: forwards -> take_credit(next); slot_override(push_slot, next, round) :: else -> skip fi
        }
#ifdef MUTANT_FREE_BEFORE_LOAD
        atomic { if :: receives -> freed[at(previous, r)] = plus_one(freed[at(previous, r)]) :: else -> skip fi }
#endif
        /* one read of the piece (the root's input), stored into the next rank's slot and the output */
        atomic {
          if :: receives -> load_piece(previous, pull_slot[previous]) :: else -> skip fi;
          if :: forwards -> store_piece(next, push_slot[next]) :: else -> skip fi
        }
        atomic {   /* ChainLink::post: the block's barrier, then the two release adds */
          if :: receives -> done_loading(previous, pull_slot[previous]) :: else -> skip fi;
          land_stores_of(r);
          if :: forwards -> data[at(next, r)] = plus_one(data[at(next, r)]) :: else -> skip fi;
#ifndef MUTANT_FREE_BEFORE_LOAD
          if :: receives -> freed[at(previous, r)] = plus_one(freed[at(previous, r)]) :: else -> skip fi
#endif
        }
        round++
     :: else -> break
     od;
     call++
  :: else -> break
  od;
  finished++
}
#endif

/* Lands one pending store, any of them, at any time; blocked while none is pending. */
#define land_option(i) :: atomic { pending[i] != 0 -> land(i) }
#define land_options_of_fifo(f) land_option(f * SLOTS) land_option(f * SLOTS + 1) \
                                land_option(f * SLOTS + 2) land_option(f * SLOTS + 3)
active proctype Memory() {
end:
  do
  land_options_of_fifo(0) land_options_of_fifo(1) land_options_of_fifo(2)
  land_options_of_fifo(3) land_options_of_fifo(4) land_options_of_fifo(5)
  land_options_of_fifo(6) land_options_of_fifo(7) land_options_of_fifo(8)
  od
}

init {
  byte i = 0;
  atomic {
    do :: i < RANKS * RANKS -> data[i] = COUNTER_START; freed[i] = COUNTER_START; i++ :: else -> break od;
    run Rank(0); run Rank(1); run Rank(2)
  }
}

ltl all_finish { <> (finished == RANKS) }
