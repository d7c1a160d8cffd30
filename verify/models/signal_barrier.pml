/* Signal counters and the barrier built on them, with their first client: the staged kernels' parity halves.
 *
 * Models (file:function):
 *   include/braid/device/sync_device.hpp: signal, wait, reached, barrier (plan 0: no announcement)
 *   src/sync/device_sync.cpp: DeviceSync::DeviceSync (counters and expected counts zeroed, expected counts in
 *     device memory that only this rank's kernels touch)
 *   src/kernels/staged.cuh: run_staged, staging_view (a call's half is its epoch's parity)
 *   src/kernels/launch_counter.cuh: read_launch_counter, advance_once_read (the epoch advances once a launch)
 *
 * Each rank is a process running CALLS back-to-back calls of run_staged on one block (channel 0): a relaxed
 * store of its input into its own staging half, the epoch advanced, the barrier, then loads of every peer's
 * half. A call of this model stands for an eager call and for a graph replay alike: everything that changes
 * from call to call (expected counts, epoch) is kept by the process across calls, as device memory is.
 *
 * Weak ordering: a rank's staging store first goes into a pending buffer (pending[]), which the Memory process
 * makes visible whenever it likes; signal()'s release add makes the rank's pending stores visible first (the
 * release is cumulative over the block, which __syncthreads ordered before it). A wait's acquire orders the
 * loads after it: the model's loads read what is visible when they run, after the wait.
 *
 * NOTE [reduced widths]
 *   The real counters (signals received, expected counts, epoch) are 64-bit and compared by their difference
 *   (reached: int64(value - target) >= 0), so they never stall on wrap-around. Here they count modulo
 *   COUNTER_MOD = 2^COUNTER_BITS and are compared the same way (REACHED). That is faithful while the distance
 *   between a slot and the target a wait compares it with stays inside the signed window [-COUNTER_MOD/2,
 *   COUNTER_MOD/2): a peer can be at most one barrier ahead of a waiter (it cannot pass its next barrier without
 *   this rank's next signal, which follows this wait), and a waiter at most one behind, so the distance is in
 *   [-1, 1], inside [-2, 2) for COUNTER_BITS 2. The counters start at COUNTER_START (a pad that has passed that
 *   many barriers, every rank at rest) so that CALLS calls wrap them; the epoch's parity is kept since
 *   COUNTER_MOD is even.
 *
 * Properties:
 *   - a rank reads a peer's half only once the peer's store of this call is visible (assert in read_peers);
 *   - no rank stores into its half while a peer still reads it (assert in the staging store);
 *   - no deadlock (invalid end states); every rank finishes every call (ltl all_finish, weak fairness).
 *
 * @run real                        safety       pass
 * @run real_progress               ltl:all_finish pass
 * @run MUTANT_SIGNAL_RELAXED       safety       assert
 *        signal() as a relaxed add: the count lands before the staging store it should follow
 * @run MUTANT_WAIT_RELAXED         safety       assert
 *        wait() as a relaxed load: the peer's data is loaded ahead of the count that says it is there
 * @run MUTANT_UNSIGNED_COMPARE     safety       assert
 *        reached() as value >= target: at the wrap-around a wait passes before the peer signalled
 * @run MUTANT_EXPECTED_BAKED       safety       assert
 *        the target taken from the launch's arguments (fixed at capture) instead of the expected count in
 *        device memory: on the second replay every wait passes at once
 * @run MUTANT_EPOCH_NOT_ADVANCED   safety       assert
 *        the epoch not advanced by the launch (a replay reuses the captured half): a rank rewrites the half
 *        a slow peer still reads
 * @run MUTANT_WAIT_BEFORE_SIGNAL   safety       deadlock
 *        the barrier waits for every peer before it signals any
 */

#define RANKS 3             /* at least 3: a rank may wait on one peer while another waits on it */
#define CALLS 3             /* back-to-back calls (or replays) of every rank */
#define HALVES 2            /* faithful to staged.cuh: calls alternate two halves by the epoch's parity */
#define COUNTER_BITS 2      /* reduced from 64: NOTE [reduced widths] */
#define COUNTER_MOD 4       /* 1 << COUNTER_BITS */
#define COUNTER_START 2     /* barriers passed before the first call, so that CALLS calls wrap the counters */
#define BARRIER_WINDOW 1    /* the largest distance between a slot and its waiter's target: NOTE [reduced widths] */

#define at(r, p) ((r) * RANKS + (p))
#define half_of(r, h) ((r) * HALVES + (h))
#define peer_of(r, k) (((r) + (k)) % RANKS)
#define plus_one(count) (((count) + 1) % COUNTER_MOD)

/* The barrier's thread p signals peer p, then waits for it. */
#ifdef MUTANT_WAIT_BEFORE_SIGNAL
#define may_signal (passed[peer_of(r, 1)] && passed[peer_of(r, 2)])
#define may_wait(p) true
#else
#define may_signal true
#define may_wait(p) signalled[p]
#endif

/* MUTANT_WAIT_RELAXED: the barrier ends once the peers' halves are loaded (ahead of the waits or not). */
#ifdef MUTANT_WAIT_RELAXED
#define early_loaded (early[peer_of(r, 1)] != 0 && early[peer_of(r, 2)] != 0)
#else
#define early_loaded true
#endif

/* The count a wait for p reaches: this rank's expected count plus one (MUTANT_EXPECTED_BAKED: the count of
   the first call, as a launch argument captured once would hold it). */
#ifdef MUTANT_EXPECTED_BAKED
#define target_of(p) plus_one(COUNTER_START)
#else
#define target_of(p) plus_one(expected[p])
#endif

#ifdef MUTANT_UNSIGNED_COMPARE
#define REACHED(value, target) ((value) >= (target))
#else
#define REACHED(value, target) ((((value) + COUNTER_MOD - (target)) % COUNTER_MOD) < COUNTER_MOD / 2)
#endif

byte slot[RANKS * RANKS];        /* slot[at(r, p)]: signals r received from p (r's pad, channel 0) */
byte staged[RANKS * HALVES];     /* r's half h as peers see it: the tag (call + 1) of the call that stored it */
byte pending[RANKS * HALVES];    /* r's store into half h that has not landed yet (0: none) */
byte reading[RANKS * HALVES];    /* peers loading r's half h now */
byte finished;                   /* ranks done with every call */

/* Makes r's pending stores visible: the release half of signal(). */
inline land_stores_of(r) {
  if :: pending[half_of(r, 0)] != 0 -> staged[half_of(r, 0)] = pending[half_of(r, 0)]; pending[half_of(r, 0)] = 0
     :: else -> skip
  fi;
  if :: pending[half_of(r, 1)] != 0 -> staged[half_of(r, 1)] = pending[half_of(r, 1)]; pending[half_of(r, 1)] = 0
     :: else -> skip
  fi
}

/* signal(pad, channel, peer): system-scope release add of 1 on the peer's slot for this rank. */
inline signal(r, p) {
  atomic {
#ifndef MUTANT_SIGNAL_RELAXED
    land_stores_of(r);
#endif
    slot[at(p, r)] = plus_one(slot[at(p, r)])
  }
}

/* The loads of read_out: every peer's half of this call, as visible now. */
inline read_peers(r, half, tag) {
  k = 1;
  do
  :: k < RANKS ->
     peer = peer_of(r, k);
     reading[half_of(peer, half)]++;
#ifdef MUTANT_WAIT_RELAXED
     assert(early[peer] == tag);   /* loaded ahead of the wait */
#else
     assert(staged[half_of(peer, half)] == tag);
#endif
     reading[half_of(peer, half)]--;
     k++
  :: else -> break
  od
}

proctype Rank(byte r) {
  byte call = 0, epoch = 0, half, k, peer;
  byte expected[RANKS];          /* pad.expected: this rank's device memory, kept across calls and replays */
  bool signalled[RANKS], passed[RANKS];
  byte early[RANKS];             /* MUTANT_WAIT_RELAXED: peers' halves as loaded before the wait */
  k = 0;
  do :: k < RANKS -> expected[k] = COUNTER_START; k++ :: else -> break od;

  do
  :: call < CALLS ->
     /* staging_view: the half of this launch, from the epoch as read at the kernel's start */
     half = epoch % HALVES;
     /* copy_in: a relaxed store into this rank's own half, which peers load after the barrier */
     atomic {
       assert(reading[half_of(r, half)] == 0);   /* no peer still reads the half this store rewrites */
       land_stores_of(r);                        /* an older store to the same place lands first (coherence) */
       pending[half_of(r, half)] = call + 1
     }
#ifndef MUTANT_EPOCH_NOT_ADVANCED
     epoch = plus_one(epoch);                    /* advance_once_read: one block, so it stores read + 1 */
#endif
     /* barrier: thread p signals peer p, then waits for it; the threads run in any order */
     k = 0;
     do :: k < RANKS -> signalled[k] = (k == r); passed[k] = (k == r); early[k] = 0; k++ :: else -> break od;
     do
     :: !signalled[peer_of(r, 1)] && may_signal -> signal(r, peer_of(r, 1)); signalled[peer_of(r, 1)] = 1
     :: !signalled[peer_of(r, 2)] && may_signal -> signal(r, peer_of(r, 2)); signalled[peer_of(r, 2)] = 1
#ifdef MUTANT_WAIT_RELAXED
     :: early[peer_of(r, 1)] == 0 -> early[peer_of(r, 1)] = staged[half_of(peer_of(r, 1), half)]
     :: early[peer_of(r, 2)] == 0 -> early[peer_of(r, 2)] = staged[half_of(peer_of(r, 2), half)]
#endif
     /* wait: target = expected + 1, stored back; then an acquire spin until the slot reaches the target */
     :: !passed[peer_of(r, 1)] && may_wait(peer_of(r, 1)) && REACHED(slot[at(r, peer_of(r, 1))], target_of(peer_of(r, 1))) ->
        expected[peer_of(r, 1)] = plus_one(expected[peer_of(r, 1)]); passed[peer_of(r, 1)] = 1
     :: !passed[peer_of(r, 2)] && may_wait(peer_of(r, 2)) && REACHED(slot[at(r, peer_of(r, 2))], target_of(peer_of(r, 2))) ->
        expected[peer_of(r, 2)] = plus_one(expected[peer_of(r, 2)]); passed[peer_of(r, 2)] = 1
     :: passed[peer_of(r, 1)] && passed[peer_of(r, 2)] && signalled[peer_of(r, 1)] && signalled[peer_of(r, 2)] &&
        early_loaded -> break
     od;
     /* __syncthreads, then read_out: every peer's half of this call */
     read_peers(r, half, call + 1);
     call++
  :: else -> break
  od;
  finished++
}

/* Lands any pending store, in any order, at any time. */
active proctype Memory() {
end:
  do
  :: atomic { pending[0] != 0 -> staged[0] = pending[0]; pending[0] = 0 }
  :: atomic { pending[1] != 0 -> staged[1] = pending[1]; pending[1] = 0 }
  :: atomic { pending[2] != 0 -> staged[2] = pending[2]; pending[2] = 0 }
  :: atomic { pending[3] != 0 -> staged[3] = pending[3]; pending[3] = 0 }
  :: atomic { pending[4] != 0 -> staged[4] = pending[4]; pending[4] = 0 }
  :: atomic { pending[5] != 0 -> staged[5] = pending[5]; pending[5] = 0 }
  od
}

init {
  byte i = 0;
  atomic {
    do :: i < RANKS * RANKS -> slot[i] = COUNTER_START; i++ :: else -> break od;
    run Rank(0); run Rank(1); run Rank(2)
  }
}

ltl all_finish { <> (finished == RANKS) }
