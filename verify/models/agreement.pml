/* Plan agreement and the fatal error word: ranks that plan a call differently fail it, every one of them, with
 * kMismatch, before they use each other's data.
 *
 * Models (file:function):
 *   include/braid/device/sync_device.hpp: barrier (a plan announced with each signal, compared with the peer's),
 *     spin_until (gives up once this rank's error word holds a failure; with a PlanCheck, answers a peer that
 *     announced another plan while the wait is unmet), announced_plan, answer_mismatch (kStoppedPlan and a
 *     signal to every peer), record_error, claim_error_word, publish_error_word, wait
 *   src/kernels/staged.cuh: run_staged (staging half by the epoch's parity, then the entry barrier)
 *   src/kernels/pipeline.cuh: post_peers, wait_peers with PlanCheck (a FIFO kernel: posts, then waits)
 *   src/sync/device_sync.cpp: DeviceSync::raise_recorded_error (every call's entry: a recorded failure stops the
 *     host; calls it enqueued before the failure landed still run)
 *   include/braid/device/sync_device.hpp: rank_stopped, claim_fatal_word, barrier_with_peer (NOTE [stopped
 *     ranks]: a kernel that starts on a stopped rank announces kStoppedPlan at its barrier and posts nothing);
 *     src/kernels/staged.cuh: run_staged (a stopped rank stages nothing); pipeline kernels (return at once)
 *
 * Each rank is a process running CALLS calls; a call runs a barrier kernel (staged: its input into its staging
 * half, the entry barrier with its plan, then loads of the peers' halves) or a FIFO kernel (pipelined: a piece
 * posted to every peer, then a wait for every peer's piece, checking the peer's barrier announcements). Every
 * rank plans each call alike, except that at most one call has one rank planning otherwise: another barrier
 * plan (another size, buffer offset) or the other kind of kernel (another buffer kind). Every combination of
 * kinds and deviating call is explored; the deviating rank is rank 0, as rotating the ranks maps the model onto
 * itself. Two FIFO kernels of different plans are left out: the plans of one call differ only through the
 * buffer kinds, which choose between barrier and FIFO kernels. A rank's host makes its next call unless it has
 * seen its error word (raise_recorded_error); it may have enqueued the call before the failure landed, so a
 * kernel may start on a rank that has already failed.
 *
 * NOTE [time]
 *   No timeouts: a wait that never passes is a deadlock here (the real one would end in kTimeout, which rule 9
 *   does not accept as the answer to a mismatch). The grace period of announced_plan (kPlanGraceNs) is a
 *   nondeterministic delay: a FIFO wait may call a mismatch at any time while the peer's other announcement is
 *   there and the wait is unmet, or keep waiting. Counters are exact integers (a few calls, no wrap-around:
 *   signal_barrier.pml covers the wrap). Two calls, where the other models run three: the call a rank plans
 *   otherwise (the first or the second) and a call enqueued behind it. A third call (a second kernel behind a
 *   failure) multiplies the states past 50 million and is not checked.
 *
 * Properties:
 *   - a rank uses a peer's data (a staging half, a FIFO piece) only if that data is the peer's for the same call
 *     with the same plan, or its own error word already holds a failure (assert in use_data);
 *   - at the end, every rank holds kErrorPlanMismatch if a rank deviated, and no failure otherwise (Verdict);
 *   - no deadlock: every rank ends without a timeout.
 * A kernel that starts on a rank whose error word holds a failure (a stopped rank) stages nothing, announces
 * kStoppedPlan at its barrier and posts nothing (sync_device.hpp, NOTE [stopped ranks]); without that rule the
 * first two break (MUTANT_STOPPED_RANK_RUNS_ON, NOTE [kernels behind a failure]).
 *
 * @run agreement                       safety  pass
 * @run MUTANT_STOPPED_RANK_RUNS_ON     safety  assert
 *        a kernel enqueued before its rank's failure landed runs as if nothing happened: it stages, signals,
 *        announces its own plan and posts (NOTE [kernels behind a failure])
 * @run MUTANT_NO_STOPPED_ANSWER        safety  deadlock
 *        answer_mismatch records the failure but answers no peer: a peer waits at its barrier forever
 * @run MUTANT_NO_PLAN_CHECK            safety  deadlock
 *        FIFO waits check no announcements: a FIFO rank waits forever for a peer parked at a barrier
 * @run MUTANT_PLAN_IN_OTHER_PARITY     safety  deadlock
 *        the barrier announces its plan in the slot of the other parity: the peer's barrier never sees it
 * @run MUTANT_NO_GIVE_UP               safety  deadlock
 *        a wait does not give up when another wait of its rank failed: a failed rank's other waits hang
 *
 * NOTE [kernels behind a failure]
 *   Counterexamples without the stopped-rank rule (MUTANT_STOPPED_RANK_RUNS_ON), both with a call enqueued on
 *   the deviating rank before its failure landed:
 *   1. rank 0 runs a barrier kernel where ranks 1 and 2 run FIFO kernels. Rank 1's FIFO wait sees rank 0's
 *      announcement and answers (kStoppedPlan); rank 0's barrier fails, and its next kernel, a FIFO kernel,
 *      posts its piece to rank 2, whose call-0 wait (still inside its grace period) takes that piece of
 *      call 1 as call 0's: rank 2 finishes call 0 with wrong data and no failure recorded.
 *   2. rank 0 runs a FIFO kernel where ranks 1 and 2 run barrier kernels. Rank 0 answers (kStoppedPlan into
 *      the slot of each peer's next barrier count, a signal each), and its next kernel, a barrier kernel of
 *      the same plan as the peers' call 0, signals again and announces its plan into the same slot (its
 *      expected counts did not move), over kStoppedPlan. A rank that reaches its call-0 barrier only then
 *      (it was late) passes it with rank 0 and loads rank 0's staging of call 1 as call 0's data.
 */

#define RANKS 3
#define CALLS 2             /* the call a rank plans otherwise, and one enqueued behind it (NOTE [time]) */
#define BARRIER_PLAN 1       /* the barrier kernel's plan */
#define OTHER_BARRIER_PLAN 2 /* a barrier kernel planned otherwise (another size, offset) */
#define FIFO_PLAN 3          /* the FIFO kernel's plan */
#define STOPPED_PLAN 7       /* kStoppedPlan */
#define MISMATCH 9           /* kErrorPlanMismatch */
#define POSTS 4              /* FIFO posts remembered per pair: more than ever outstanding */

#define at(r, p) ((r) * RANKS + (p))
#define peer_of(r, k) (((r) + (k)) % RANKS)
#define plan_slot(r, p, count) (at(r, p) * 2 + (count) % 2)
#define is_barrier(plan) ((plan) == BARRIER_PLAN || (plan) == OTHER_BARRIER_PLAN)

byte plan_of[RANKS * CALLS];    /* what each rank's kernels do for each call */
bool deviated;                  /* one rank planned a call otherwise */
byte barrier_count[RANKS * RANKS];   /* r's pad, barrier channel: signals received from p */
byte announced[RANKS * RANKS * 2];   /* r's pad: the plan p announced, by the parity of the barrier's count */
byte fifo_count[RANKS * RANKS];      /* r's pad, FIFO channel: pieces p posted to r */
byte fifo_call[RANKS * RANKS * POSTS];   /* the call (+ 1) whose piece the n-th post from p to r carries */
byte staged_call[RANKS * 2];    /* r's staging half h: the call (+ 1) whose input it holds */
byte code[RANKS];               /* the fatal error word's code (0: none) */
bool claimed[RANKS];
byte finished;

/* record_error: the first failure of a rank claims its word and publishes the code; later ones are dropped. */
inline record_mismatch() {
  if :: !claimed[r] -> claimed[r] = true; code[r] = MISMATCH :: else -> skip fi
}

/* The data of `peer` that this rank uses in this call must be the peer's for this call, with this plan, unless
   this rank has already failed (its host raises before it hands anything on). */
#define data_ok(peer, tag) (code[r] != 0 || ((tag) == call + 1 && plan_of[(peer) * CALLS + call] == plan))
inline use_data(peer, tag) {
  assert(data_ok(peer, tag))
}

/* answer_mismatch: kStoppedPlan and a signal for the next barrier of every peer, then the failure recorded.
   Only the thread that claims the word answers. */
inline answer_mismatch() {
  atomic {
    if
    :: !claimed[r] ->
       claimed[r] = true;
#ifndef MUTANT_NO_STOPPED_ANSWER
       announced[plan_slot(peer_of(r, 1), r, expected_barrier[peer_of(r, 1)] + 1)] = STOPPED_PLAN;
       barrier_count[at(peer_of(r, 1), r)]++;
       announced[plan_slot(peer_of(r, 2), r, expected_barrier[peer_of(r, 2)] + 1)] = STOPPED_PLAN;
       barrier_count[at(peer_of(r, 2), r)]++;
#endif
       code[r] = MISMATCH
    :: else -> skip
    fi
  }
}

/* NOTE [stopped ranks] (sync_device.hpp): a kernel that starts on a rank whose error word holds a failure
   stages nothing, announces kStoppedPlan at its barriers and posts no FIFO piece. */
#ifdef MUTANT_STOPPED_RANK_RUNS_ON
#define announced_plan_of_kernel plan
#define posts_pieces true
#define stages true
#define waits_at_barrier true
#else
#define announced_plan_of_kernel (stopped -> STOPPED_PLAN : plan)
#define posts_pieces (!stopped)
#define stages (!stopped)
#endif
#define waits_at_barrier (!stopped)   /* a stopped rank's barrier answers and fails without waiting */

#ifdef MUTANT_NO_GIVE_UP
#define gives_up false
#else
#define gives_up (code[r] != 0)   /* spin_until: another wait of this rank failed */
#endif

#ifdef MUTANT_PLAN_IN_OTHER_PARITY
#define announce_count(p) (expected_barrier[p] + 2)
#else
#define announce_count(p) (expected_barrier[p] + 1)
#endif

/* The barrier thread for peer p: signal, announce, then wait for p's signal and announcement together. The
   signal and the announcement are one step here: a peer's wait needs both, so no state between them lets it on. */
#define barrier_thread(p) \
  :: !announcing[p] -> \
     atomic { barrier_count[at(p, r)]++; announced[plan_slot(p, r, announce_count(p))] = announced_plan_of_kernel; \
              announcing[p] = true } \
  :: announcing[p] && !done[p] && waits_at_barrier && barrier_count[at(r, p)] >= expected_barrier[p] + 1 && \
     announced[plan_slot(r, p, expected_barrier[p] + 1)] != 0 -> \
     atomic { \
       theirs = announced[plan_slot(r, p, expected_barrier[p] + 1)]; \
       announced[plan_slot(r, p, expected_barrier[p] + 1)] = 0; \
       expected_barrier[p]++; done[p] = true; \
       if :: theirs != plan -> record_mismatch(); failed = true :: else -> skip fi; \
       theirs = 0 \
     } \
  :: announcing[p] && !done[p] && gives_up -> atomic { expected_barrier[p]++; done[p] = true; failed = true }

/* The FIFO wait for peer p's next piece, with the PlanCheck of the barrier channel. */
#define peer_announces_other(p) \
  (announced[plan_slot(r, p, expected_barrier[p] + 1)] != 0 && announced[plan_slot(r, p, expected_barrier[p] + 1)] != plan)
#ifdef MUTANT_NO_PLAN_CHECK
#define may_answer(p) false
#else
#define may_answer(p) (peer_announces_other(p) && fifo_count[at(r, p)] < expected_fifo[p] + 1)
#endif
#define fifo_thread(p) \
  :: !done[p] && fifo_count[at(r, p)] >= expected_fifo[p] + 1 -> \
     atomic { expected_fifo[p]++; got[p] = fifo_call[at(r, p) * POSTS + expected_fifo[p] % POSTS]; done[p] = true } \
  :: !done[p] && gives_up -> atomic { expected_fifo[p]++; done[p] = true; failed = true } \
  :: !done[p] && may_answer(p) -> answer_mismatch(); atomic { expected_fifo[p]++; done[p] = true; failed = true }

proctype Rank(byte r) {
  byte call = 0, plan, epoch = 0, theirs, k;
  bool stopped;                 /* this rank's error word held a failure when the kernel started */
  byte expected_barrier[RANKS], expected_fifo[RANKS];   /* pad.expected: this rank's device memory */
  bool announcing[RANKS], done[RANKS], failed;
  byte got[RANKS];
  do
  :: call < CALLS ->
     /* the host: raise_recorded_error at the call's entry stops it, unless it enqueued the call before */
     if :: code[r] != 0 -> break :: true -> skip fi;
     atomic {
       plan = plan_of[r * CALLS + call]; failed = false; stopped = (code[r] != 0);
       k = 0;
       do
       :: k < RANKS -> announcing[k] = (k == r); done[k] = (k == r); got[k] = 0; k++
       :: else -> k = 0; break
       od
     }
     if
     :: is_barrier(plan) ->
        /* run_staged: the input into this rank's half, the epoch advanced, the entry barrier */
        atomic { if :: stages -> staged_call[r * 2 + epoch % 2] = call + 1; epoch++ :: else -> skip fi }
        do
        barrier_thread(peer_of(r, 1))
        barrier_thread(peer_of(r, 2))
        :: done[peer_of(r, 1)] && done[peer_of(r, 2)] -> break
        od;
        /* read_out: the peers' halves of this call (the half of this launch's epoch) */
        if
        :: !failed -> atomic { use_data(peer_of(r, 1), staged_call[peer_of(r, 1) * 2 + (epoch - 1) % 2]);
                               use_data(peer_of(r, 2), staged_call[peer_of(r, 2) * 2 + (epoch - 1) % 2]) }
        :: else -> skip
        fi
     :: else ->
        /* post_peers: a piece to every peer, then wait_peers */
        atomic {
          if
          :: posts_pieces ->
             fifo_count[at(peer_of(r, 1), r)]++;
             fifo_call[at(peer_of(r, 1), r) * POSTS + fifo_count[at(peer_of(r, 1), r)] % POSTS] = call + 1;
             fifo_count[at(peer_of(r, 2), r)]++;
             fifo_call[at(peer_of(r, 2), r) * POSTS + fifo_count[at(peer_of(r, 2), r)] % POSTS] = call + 1
          :: else -> failed = true; done[peer_of(r, 1)] = true; done[peer_of(r, 2)] = true
          fi
        }
        do
        fifo_thread(peer_of(r, 1))
        fifo_thread(peer_of(r, 2))
        :: done[peer_of(r, 1)] && done[peer_of(r, 2)] -> break
        od;
        if
        :: !failed -> atomic { use_data(peer_of(r, 1), got[peer_of(r, 1)]); use_data(peer_of(r, 2), got[peer_of(r, 2)]) }
        :: else -> skip
        fi
     fi;
     call++
  :: else -> break
  od;
  finished++
}

/* At the end: every rank failed with kMismatch if a rank deviated; none failed otherwise. */
active proctype Verdict() {
  finished == RANKS ->
  if
  :: deviated -> assert(code[0] == MISMATCH && code[1] == MISMATCH && code[2] == MISMATCH)
  :: else -> assert(code[0] == 0 && code[1] == 0 && code[2] == 0)
  fi
}

init {
  byte c = 0, kind, odd_call, odd_rank;
  atomic {
    /* each call's kernel kind, the same on every rank */
    do
    :: c < CALLS ->
       if :: kind = BARRIER_PLAN :: kind = FIFO_PLAN fi;
       plan_of[0 * CALLS + c] = kind; plan_of[1 * CALLS + c] = kind; plan_of[2 * CALLS + c] = kind;
       c++
    :: else -> break
    od;
    /* at most one call where one rank plans otherwise */
    if
    :: skip
    :: select(odd_call : 0 .. CALLS - 1);
       odd_rank = 0;   /* the model is symmetric under rotating the ranks (peers are r + 1 and r + 2) */
       deviated = true;
       if
       :: plan_of[odd_rank * CALLS + odd_call] == BARRIER_PLAN ->
          if :: plan_of[odd_rank * CALLS + odd_call] = OTHER_BARRIER_PLAN
             :: plan_of[odd_rank * CALLS + odd_call] = FIFO_PLAN
          fi
       :: else -> plan_of[odd_rank * CALLS + odd_call] = BARRIER_PLAN
       fi
    fi;
    c = 0; kind = 0; odd_call = 0; odd_rank = 0;
    run Rank(0); run Rank(1); run Rank(2)
  }
}
