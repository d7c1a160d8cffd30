/* The announcing kernels, as the all-gather runs them: announcements beside the entry barrier, one decision on every rank, and the staged
 * path's rounds through the staging halves.
 *
 * Models (file:function):
 *   src/kernels/announced.cuh: enter_announced (the announcements stored into the peer's slots of the entry barrier
 *     count's parity before the barrier, read after it; what runs before the barrier; staged where any word says
 *     so), StagedRounds (round i in half (epoch + i) mod 2; a rank whose own word is staged copies round 0 in
 *     before the entry barrier, and where every rank did, the entry barrier is round 0's; a barrier after every
 *     other copy-in; a last barrier where the call has more than one round); the all-gather's use of them
 *     (src/kernels/all_gather_announced.cu). Reduce-scatter, all-reduce and all-to-all use the same entry and
 *     rounds; a call announces one word a buffer (at most two), stored and read beside each other under the same
 *     release and acquire, so one word a call stands for them (the one that decides whether the call is staged).
 *   include/braid/device/sync_device.hpp: signal, wait, barrier (as signal_barrier.pml models them)
 *   src/kernels/launch_counter.cuh: read_launch_start, advance_once_read (the epoch advances once a launch)
 *
 * Two ranks run three back-to-back calls on one block (channel 0): two announcing all-gathers, then a plain staged
 * kernel (run_staged: its copy into its half before its barrier), the call that may follow. At each announcing
 * call a rank announces exposed or staged, as it likes (each rank's buffers are its own); the word it reads and
 * its decision are checked. The zero-copy path's stores into the peer's output are signal_barrier.pml's and not
 * modelled: it ends with the exit barrier. Each announcing call has 1 or 2 rounds (chosen at the start, the same
 * on every rank: the call's count), so a one-round call without a last barrier is followed by each kind of call.
 * Two ranks keep the search within the suite's time; signal_barrier.pml checks the barrier itself on three.
 *
 * Weak ordering as in signal_barrier.pml: a rank's relaxed stores (announcements into peers' slots, staging) go
 * into pending buffers that the Memory process lands when it likes; signal()'s release lands the rank's pending
 * stores first; loads after a wait's acquire read what is visible then.
 *
 * Counters count modulo COUNTER_MOD and compare by difference (NOTE [reduced widths] in signal_barrier.pml): a
 * peer is at most one barrier ahead of a waiter, so the distance stays in [-1, 1].
 *
 * Properties:
 *   - a rank reads, after the entry barrier, the word each peer announced for this very call (assert);
 *   - every rank takes the same path for a call (assert against the decisions already made);
 *   - a rank reads a peer's staging half only once the peer's store of this round is visible, and no rank stores
 *     into its half while a peer still reads it (asserts);
 *   - no deadlock; every rank finishes every call (ltl all_finish).
 *
 * @run real                              safety          pass
 * @run real_progress                     ltl:all_finish  pass
 * @run MUTANT_ANNOUNCE_AFTER_SIGNAL      safety          assert
 *        the announcement stored after the barrier's signal: a peer can pass the barrier and read the old word
 * @run MUTANT_ONE_ANNOUNCEMENT_SLOT      safety          assert
 *        one slot a sender instead of two by the count's parity, and no barrier after the read (a zero-copy
 *        path without its exit barrier): the next call's word lands before a slow peer read this one's
 * @run MUTANT_NO_LAST_BARRIER            safety          assert
 *        calls of two rounds end without their last barrier too: the next call rewrites a half a peer still reads
 * @run MUTANT_FIRST_BARRIER_SKIPPED_ALONE safety         assert
 *        a rank that copied round 0 in before the entry barrier skips round 0's barrier though a peer did not
 *        copy first: it reads the peer's half before the peer's copy
 * @run MUTANT_ONE_HALF_FOR_EVERY_ROUND   safety          assert
 *        every round in the launch's half: round 2 rewrites the half a peer still reads from round 1
 */

#define RANKS 2
#define CALLS 3             /* two announcing calls, then a plain staged one */
#define ANNOUNCING_CALLS 2
#define ROUNDS 2            /* at most, a call */
#define HALVES 2
#define COUNTER_MOD 4
#define COUNTER_START 2

#define at(r, p) ((r) * RANKS + (p))
#define half_of(r, h) ((r) * HALVES + (h))
#define peer_of(r, k) (((r) + (k)) % RANKS)
#define plus_one(count) (((count) + 1) % COUNTER_MOD)
#define REACHED(value, target) ((((value) + COUNTER_MOD - (target)) % COUNTER_MOD) < COUNTER_MOD / 2)

#ifdef MUTANT_ONE_ANNOUNCEMENT_SLOT
#define parity_of(count) 0
#else
#define parity_of(count) ((count) % 2)
#endif
/* slot of what `sender` announced to `receiver` for a barrier of `count` */
#define word_slot(receiver, sender, count) ((at(receiver, sender)) * 2 + parity_of(count))

byte slot[RANKS * RANKS];           /* slot[at(r, p)]: signals r received from p */
byte word[RANKS * RANKS * 2];       /* announcements as visible: (call + 1) * 2 + exposed */
byte word_pending[RANKS * RANKS * 2];
byte staging[RANKS * HALVES];       /* r's half h as peers see it: (call * ROUNDS + round + 1) of its store */
byte staging_pending[RANKS * HALVES];
byte reading[RANKS * HALVES];       /* peers loading r's half h now */
byte decision[ANNOUNCING_CALLS];    /* 0: no rank decided call c yet; 1: zero copy; 2: staged */
byte rounds_of[ANNOUNCING_CALLS];   /* the rounds of call c's staged path: 1 or 2, alike on every rank */
byte finished;

/* Lands r's pending announcements (stores r made into the peers' slots) and its pending staging stores. */
inline land_all_of(r) {
  i = 0;
  do
  :: i < RANKS ->
     if
     :: word_pending[word_slot(i, r, 0)] != 0 -> word[word_slot(i, r, 0)] = word_pending[word_slot(i, r, 0)];
        word_pending[word_slot(i, r, 0)] = 0
     :: else -> skip
     fi;
     if
     :: word_pending[word_slot(i, r, 1)] != 0 -> word[word_slot(i, r, 1)] = word_pending[word_slot(i, r, 1)];
        word_pending[word_slot(i, r, 1)] = 0
     :: else -> skip
     fi;
     i++
  :: else -> break
  od;
  if :: staging_pending[half_of(r, 0)] != 0 -> staging[half_of(r, 0)] = staging_pending[half_of(r, 0)];
        staging_pending[half_of(r, 0)] = 0
     :: else -> skip
  fi;
  if :: staging_pending[half_of(r, 1)] != 0 -> staging[half_of(r, 1)] = staging_pending[half_of(r, 1)];
        staging_pending[half_of(r, 1)] = 0
     :: else -> skip
  fi
}

/* signal(pad, channel, peer): release add; r's pending stores land first. */
inline signal(r, p) {
  atomic {
    land_all_of(r);
    slot[at(p, r)] = plus_one(slot[at(p, r)])
  }
}

/* barrier(pad, channel, ...): thread p signals peer p, then waits for it, threads in any order. `count` holds the
   count the barrier reaches with each peer (the same with every peer: barriers alone use channel 0). */
inline barrier(r) {
  k = 0;
  do :: k < RANKS -> signalled[k] = (k == r); passed[k] = (k == r); k++ :: else -> break od;
  do
  :: !signalled[peer_of(r, 1)] -> signal(r, peer_of(r, 1)); signalled[peer_of(r, 1)] = 1
  :: !passed[peer_of(r, 1)] && signalled[peer_of(r, 1)] &&
     REACHED(slot[at(r, peer_of(r, 1))], plus_one(expected[peer_of(r, 1)])) ->
     expected[peer_of(r, 1)] = plus_one(expected[peer_of(r, 1)]); passed[peer_of(r, 1)] = 1
  :: passed[peer_of(r, 1)] && signalled[peer_of(r, 1)] -> break
  od
}

/* This rank's announcement store into peer p's slot for the coming barrier (relaxed: pending until it lands). */
inline announce(r, p, value) {
  atomic {
    if :: word_pending[word_slot(p, r, plus_one(expected[p]))] != 0 ->   /* an older store lands first */
          word[word_slot(p, r, plus_one(expected[p]))] = word_pending[word_slot(p, r, plus_one(expected[p]))]
       :: else -> skip
    fi;
    word_pending[word_slot(p, r, plus_one(expected[p]))] = value
  }
}

proctype Rank(byte r) {
  byte call = 0, epoch = 0, start, k, i, round, half, peer, mine, theirs, count_seen;
  byte expected[RANKS];
  bool signalled[RANKS], passed[RANKS], staged_call, copied_first, everyone_copied_first;
  k = 0;
  do :: k < RANKS -> expected[k] = COUNTER_START; k++ :: else -> break od;

  do
  :: call == ANNOUNCING_CALLS ->
     /* run_staged: the copy into this call's half before the barrier, then the peer's half */
     half = epoch % HALVES;
     epoch = plus_one(epoch);
     atomic {
       assert(reading[half_of(r, half)] == 0);   /* no peer still reads the half this store rewrites */
       if :: staging_pending[half_of(r, half)] != 0 -> staging[half_of(r, half)] = staging_pending[half_of(r, half)]
          :: else -> skip
       fi;
       staging_pending[half_of(r, half)] = call * ROUNDS + 1
     }
     barrier(r);
     peer = peer_of(r, 1);
     reading[half_of(peer, half)]++;
     assert(staging[half_of(peer, half)] == call * ROUNDS + 1);
     reading[half_of(peer, half)]--;
     call++
  :: call < ANNOUNCING_CALLS ->
     /* this rank's word for the call: exposed or staged, as its buffers happen to be */
     if :: mine = (call + 1) * 2 + 1 :: mine = (call + 1) * 2 fi;
     start = epoch;                    /* read_launch_start */
     epoch = plus_one(epoch);          /* advance_once_read */
#ifndef MUTANT_ANNOUNCE_AFTER_SIGNAL
     announce(r, peer_of(r, 1), mine);
#endif
     /* before the barrier: a rank whose own word makes the call staged copies round 0 in (copy_first) */
     copied_first = (mine % 2 == 0);
     if
     :: copied_first ->
        half = start % HALVES;
        atomic {
          assert(reading[half_of(r, half)] == 0);   /* no peer still reads the half this store rewrites */
          if :: staging_pending[half_of(r, half)] != 0 -> staging[half_of(r, half)] = staging_pending[half_of(r, half)]
             :: else -> skip
          fi;
          staging_pending[half_of(r, half)] = call * ROUNDS + 1
        }
     :: else -> skip
     fi;
     count_seen = plus_one(expected[peer_of(r, 1)]);   /* the entry barrier's count (alike with both peers) */
#ifdef MUTANT_ANNOUNCE_AFTER_SIGNAL
     /* the store after the signal */
     signal(r, peer_of(r, 1));
     atomic { word_pending[word_slot(peer_of(r, 1), r, count_seen)] = mine };
     do
     :: REACHED(slot[at(r, peer_of(r, 1))], plus_one(expected[peer_of(r, 1)])) ->
        expected[peer_of(r, 1)] = plus_one(expected[peer_of(r, 1)]); break
     od;
#else
     barrier(r);                       /* the entry barrier */
#endif
     /* read every peer's word for this call; staged where any word (this rank's too) says so */
     staged_call = (mine % 2 == 0);
     everyone_copied_first = copied_first;
     k = 1;
     do
     :: k < RANKS ->
        peer = peer_of(r, k);
        theirs = word[word_slot(r, peer, count_seen)];
        assert(theirs / 2 == call + 1);   /* the word of this very call, not an older or newer one */
        if :: theirs % 2 == 0 -> staged_call = 1 :: else -> everyone_copied_first = 0 fi;
        k++
     :: else -> break
     od;
     atomic {
       if
       :: decision[call] == 0 -> decision[call] = (staged_call -> 2 : 1)
       :: else -> assert(decision[call] == (staged_call -> 2 : 1))   /* every rank takes the same path */
       fi
     }
     if
     :: !staged_call ->
#ifndef MUTANT_ONE_ANNOUNCEMENT_SLOT
        barrier(r)                     /* the zero-copy path's exit barrier */
#else
        skip
#endif
     :: else ->
        round = 0;
        do
        :: round < rounds_of[call] ->
#ifdef MUTANT_ONE_HALF_FOR_EVERY_ROUND
           half = start % HALVES;
#else
           half = (start + round) % HALVES;
#endif
           if
           :: round > 0 || !copied_first ->
              atomic {
                assert(reading[half_of(r, half)] == 0);   /* no peer still reads the half this store rewrites */
                if :: staging_pending[half_of(r, half)] != 0 ->
                      staging[half_of(r, half)] = staging_pending[half_of(r, half)]
                   :: else -> skip
                fi;
                staging_pending[half_of(r, half)] = call * ROUNDS + round + 1
              }
           :: else -> skip
           fi;
#ifdef MUTANT_FIRST_BARRIER_SKIPPED_ALONE
           if :: round > 0 || !copied_first -> barrier(r) :: else -> skip fi;
#else
           if :: round > 0 || !everyone_copied_first -> barrier(r)   /* the round's barrier */
              :: else -> skip                                          /* the entry barrier was round 0's */
           fi;
#endif
           k = 1;
           do
           :: k < RANKS ->
              peer = peer_of(r, k);
              reading[half_of(peer, half)]++;
              assert(staging[half_of(peer, half)] == call * ROUNDS + round + 1);
              reading[half_of(peer, half)]--;
              k++
           :: else -> break
           od;
           round++
        :: else -> break
        od;
#ifndef MUTANT_NO_LAST_BARRIER
        if :: rounds_of[call] != 1 -> barrier(r)   /* the last barrier: every peer read every half */
           :: else -> skip                         /* one round: the next call writes the other half */
        fi
#else
        skip
#endif
     fi;
     call++
  :: else -> break
  od;
  finished++
}

/* Lands any pending store, in any order, at any time. */
active proctype Memory() {
  byte m;
end:
  do
  :: atomic { m = 0;
       do
       :: m < RANKS * RANKS * 2 && word_pending[m] != 0 -> word[m] = word_pending[m]; word_pending[m] = 0; break
       :: m < RANKS * RANKS * 2 -> m++
       :: m == RANKS * RANKS * 2 -> break
       od }
  :: atomic { m = 0;
       do
       :: m < RANKS * HALVES && staging_pending[m] != 0 -> staging[m] = staging_pending[m]; staging_pending[m] = 0; break
       :: m < RANKS * HALVES -> m++
       :: m == RANKS * HALVES -> break
       od }
  od
}

init {
  byte n = 0;
  atomic {
    do :: n < RANKS * RANKS -> slot[n] = COUNTER_START; n++ :: else -> break od;
    n = 0;
    do :: n < ANNOUNCING_CALLS -> if :: rounds_of[n] = 1 :: rounds_of[n] = 2 fi; n++ :: else -> break od;
    run Rank(0); run Rank(1)
  }
}

ltl all_finish { <> (finished == RANKS) }
