/* The grace period of a FIFO wait's PlanCheck: another plan announced by the peer, with the wait still unmet a
 * grace period later, is a true mismatch, because the kernel boundary (not a release/acquire pair) orders the
 * peer's announcement of its next barrier after everything it sent in this call.
 *
 * Models (file:function):
 *   include/braid/device/sync_device.hpp: spin_until (the PlanCheck branch: first sighting of another plan,
 *     the grace period kPlanGraceNs, the re-test `!ready()` after it, then answer_mismatch), announced_plan (the
 *     slot of this rank's next barrier count on the check's channel), answer_mismatch (kStoppedPlan and a signal
 *     for the peer's next barrier), barrier (signal, then the plan as a relaxed store, then the wait for signal
 *     and plan together, the slot cleared once read), signal (a release add), wait
 *   src/kernels/pipeline.cuh: post_peers (a piece's data, then a release signal), wait_peers (a FIFO wait
 *     per piece, with a PlanCheck)
 *   the CUDA stream order: a kernel's stores are performed before the next kernel on its stream starts (the
 *     boundary acts as a fence)
 *
 * Two ranks: R (0) waits, S (1) sends. Both first run two barrier calls (barrier counts 1 and 2: both parities
 * of the plan slots used once, so a stale announcement would sit in the slot the next FIFO wait checks). Then:
 *   S: kernel K1 posts `sent` pieces to R: per piece, the data store (in flight, lands later), then a release
 *      signal (lands only after the piece's data, and every earlier store, has landed); then the kernel
 *      boundary, an explicit step that waits until every store of K1 has landed; then kernel K2, the barrier of
 *      S's next call: signal, then its plan word into R's plan slot (a relaxed store, in flight, that lands at
 *      any time), then its wait for R.
 *   R: call 1, a FIFO wait for PIECES pieces with a PlanCheck (its plan FIFO_PLAN), reading each piece once its
 *      wait is met; then, unless it declared a mismatch, the barrier of its call 2.
 * Configurations (chosen in init, every one explored):
 *   matching:    S posts every piece R waits for; S's next call (K2) plans alike with R's call 2, either the same
 *                plan word as R's FIFO call (not foreign to the check) or another (NEXT_PLAN: foreign to the
 *                check, so the grace argument carries it).
 *   mismatching: S planned call 1 otherwise: it posts fewer pieces (0 or PIECES - 1) and its barrier (its call
 *                1's, or its next call's: the same for R) announces OTHER_PLAN. R's wait can never be met.
 *
 * The spin loop of spin_until is over-approximated: R takes, in any order and as often as enabled, (a) the
 * wait test, (b) the first sighting of another plan (announced_at), (c) a grace expiry once it has seen one
 * (with the re-test of the wait). In the code every plan check follows a wait test in the same iteration, so
 * between the first sighting and the grace expiry at least one wait test runs after the sighting; the
 * over-approximation drops that, and the re-test alone carries the argument (MUTANT_NO_RETEST). No timeouts:
 * a wait that never passes is a deadlock.
 *
 * Reduced widths: two ranks (the argument is per pair, sender and waiting thread; agreement.pml covers three
 * ranks and the fan-out of answer_mismatch); one barrier channel; two pieces (one piece before K1's last
 * signal, and the last); exact counters (no wrap-around: signal_barrier.pml covers it); plan words are small
 * integers.
 *
 * Properties:
 *   - a mismatch is declared (by the FIFO wait, or by a barrier) only in the mismatching configuration (assert
 *     at the declaration, and Verdict);
 *   - in the mismatching configuration every run ends with R's mismatch declared and S's barrier failed
 *     (Verdict); no deadlock (invalid end states);
 *   - R reads a piece only once its data is visible (assert in read_piece).
 *
 * @run real_model                      safety  pass
 * @run MUTANT_NO_BOUNDARY_FENCE        safety  assert
 *        the kernel boundary lands nothing: K2's announcement can land before K1's data and signals, and R calls
 *        a mismatch in a matching run
 * @run MUTANT_ANNOUNCE_IN_K1           safety  assert
 *        the announcement is written inside K1, before its last signal: R sees it with the last piece unsent
 * @run MUTANT_NO_RETEST                safety  assert
 *        after the grace period the wait is not tested again: a sighting followed by the data counts as a
 *        mismatch
 * @run MUTANT_NO_CLEAR                 safety  assert
 *        a barrier does not clear the plan slot it read: the FIFO wait two barriers later sees that stale
 *        announcement as another plan while the sender is merely slow
 */

#define R 0
#define S 1
#define PIECES 2
#define FIFO_PLAN 1     /* R's FIFO call: its PlanCheck's plan */
#define BARRIER_PLAN 2  /* the two barrier calls before it */
#define NEXT_PLAN 3     /* a next call planned alike on both ranks, foreign to R's check */
#define OTHER_PLAN 4    /* S's plan where it planned call 1 otherwise */
#define STOPPED_PLAN 7  /* kStoppedPlan */
#define NONE 0
#define NOW 1
#define IN_FLIGHT 2

#define slot_of(r, count) ((r) * 2 + (count) % 2)

bool mismatching;               /* the configuration */
byte sent;                      /* pieces S's K1 posts */
byte k2_plan;                   /* the plan S's K2 announces */
byte r_next_plan;               /* R's call-2 plan */

byte bsig[2];                   /* barrier channel: signals received by r */
byte slot[4];                   /* plan slots: slot[slot_of(r, count)] the plan announced to r for its barrier count */
byte expected_b[2];             /* pad.expected of the barrier channel, per rank (for its one peer) */
bool data_pend[PIECES];         /* S's data stores in flight */
bool data_vis[PIECES];          /* landed: visible to R */
byte sig_issued;                /* S's FIFO signals issued */
byte fifo_vis;                  /* R's FIFO counter: S's signals landed */
bool plan_pend;                 /* S's announcement in flight (relaxed) */
byte plan_pend_val, plan_pend_idx;

bool declared;                  /* R's FIFO wait called a mismatch (answer_mismatch) */
bool bar_failed[2];             /* a barrier recorded kErrorPlanMismatch */
byte finished;

/* barrier: signal, announce, then the wait for signal and plan together; the slot is cleared once read, and the
   plans compared. announce: NOW (a store that lands at once: the barriers whose ordering is not the point here),
   IN_FLIGHT (S's K2: a relaxed store through the store layer), NONE (written already, MUTANT_ANNOUNCE_IN_K1). */
inline barrier(r, p, myplan, announce) {
  atomic {
    count = expected_b[r] + 1;
    bsig[p]++;
    if
    :: announce == IN_FLIGHT -> plan_pend_val = myplan; plan_pend_idx = slot_of(p, count); plan_pend = true
    :: announce == NOW -> slot[slot_of(p, count)] = myplan
    :: announce == NONE -> skip
    fi;
    expected_b[r] = count
  }
  atomic {
    bsig[r] >= count && slot[slot_of(r, count)] != 0 ->
    theirs = slot[slot_of(r, count)];
#ifndef MUTANT_NO_CLEAR
    slot[slot_of(r, count)] = 0;
#endif
    if :: theirs != myplan -> bar_failed[r] = true; assert(mismatching) :: else -> skip fi;
    theirs = 0
  }
}

/* The store layer of S's stores to R: data lands at any time; a release signal only after every store before
   it (the data of its piece and of earlier ones); the relaxed announcement at any time. */
active proctype Memory() {
end:
  do
  :: atomic { data_pend[0] -> data_pend[0] = false; data_vis[0] = true }
  :: atomic { data_pend[1] -> data_pend[1] = false; data_vis[1] = true }
  :: atomic { fifo_vis < sig_issued && data_vis[fifo_vis] -> fifo_vis++ }
  :: atomic { plan_pend -> slot[plan_pend_idx] = plan_pend_val; plan_pend = false; plan_pend_val = 0;
              plan_pend_idx = 0 }
  od
}

proctype Sender() {
  byte count, theirs, i = 0;
  bool announced = false;
  barrier(S, R, BARRIER_PLAN, NOW);
  barrier(S, R, BARRIER_PLAN, NOW);
  /* K1: post_peers, `sent` pieces */
  do
  :: i < sent ->
     data_pend[i] = true;
#ifdef MUTANT_ANNOUNCE_IN_K1
     if
     :: i == sent - 1 ->
        atomic { plan_pend_val = k2_plan; plan_pend_idx = slot_of(R, expected_b[S] + 1); plan_pend = true;
                 announced = true }
     :: else -> skip
     fi;
#endif
     atomic { sig_issued++; i++ }
  :: else -> break
  od;
  /* the kernel boundary: every store of K1 performed before K2 starts */
#ifndef MUTANT_NO_BOUNDARY_FENCE
  (!data_pend[0] && !data_pend[1] && fifo_vis == sig_issued);
#endif
  /* K2: the barrier of S's next call (or of its call 1, planned otherwise) */
  if :: announced -> barrier(S, R, k2_plan, NONE) :: else -> barrier(S, R, k2_plan, IN_FLIGHT) fi;
  finished++
}

#define their_plan slot[slot_of(R, expected_b[R] + 1)]     /* announced_plan */
#define foreign (their_plan != 0 && their_plan != FIFO_PLAN)

inline read_piece(k) {
  assert(data_vis[k])
}

proctype Receiver() {
  byte count, theirs, k = 0;
  bool seen;                    /* announced_at != 0 */
  barrier(R, S, BARRIER_PLAN, NOW);
  barrier(R, S, BARRIER_PLAN, NOW);
  /* call 1: wait_peers, a FIFO wait per piece with PlanCheck{FIFO_PLAN} */
  do
  :: k < PIECES && !declared ->
     seen = false;
     do
     :: fifo_vis >= k + 1 -> break                        /* ready() */
     :: atomic { foreign && !seen -> seen = true }        /* first sighting: announced_at = now */
     :: atomic { foreign && seen ->                       /* still there, the grace period past */
#ifdef MUTANT_NO_RETEST
          declared = true
#else
          if :: fifo_vis < k + 1 -> declared = true :: else -> skip fi
#endif
        }
        if :: declared -> break :: else -> skip fi
     od;
     if
     :: declared ->
        /* answer_mismatch: kStoppedPlan and a signal for S's next barrier; the failure recorded */
        atomic { assert(mismatching); slot[slot_of(S, expected_b[R] + 1)] = STOPPED_PLAN; bsig[S]++ }
     :: else -> read_piece(k); k++
     fi
  :: else -> break
  od;
  /* the host raises the recorded failure at the next call's entry; otherwise call 2's barrier */
  if
  :: !declared -> barrier(R, S, r_next_plan, NOW)
  :: else -> skip
  fi;
  finished++
}

active proctype Verdict() {
  finished == 2 ->
  assert(declared == mismatching && !bar_failed[R] && bar_failed[S] == mismatching)
}

init {
  atomic {
    if
    :: mismatching = false; sent = PIECES;
       if :: k2_plan = FIFO_PLAN :: k2_plan = NEXT_PLAN fi;
       r_next_plan = k2_plan
    :: mismatching = true; k2_plan = OTHER_PLAN; r_next_plan = 0;
       if :: sent = 0 :: sent = PIECES - 1 fi
    fi;
    run Sender(); run Receiver()
  }
}
