/* A failure the host publishes in a rank's fatal error word (a peer's exit, abort, revoke) beside the failures
 * that rank's kernels record in it: one failure wins the word whole, every wait of the rank ends, and a kernel
 * that starts behind a call its stream abandoned never runs that call's successor as if nothing happened.
 *
 * Models (file:function):
 *   src/sync/device_sync.cpp: DeviceSync::publish_failure (claim the word with a compare-and-swap, fill the
 *     fields, publish the code with a release, then enqueue a copy that marks the rank stopped, never waited for)
 *   include/braid/device/sync_device.hpp: record_error via claim_fatal_word (mark stopped, claim, fields,
 *     publish), spin_until (marks the rank stopped and gives up once the word's code is nonzero), rank_stopped
 *     and NOTE [stopped ranks] (a kernel that starts on a stopped rank acts on nothing)
 *   src/sync/device_sync.cpp: DeviceSync::raise_recorded_error (reads the code with acquire, then the fields)
 *
 * One rank. Its stream runs K1, whose wait passes when the peer signals (which may never happen) or gives up once
 * the word holds a failure, then K2, which starts only after K1 ended (stream order) and reads the stopped flag
 * at its start. In some runs K1 also records a failure of its own (a mismatch its wait answers). The host
 * publishes a failure at any time (the watch thread, or abort); its copy of the flag lands at any time after it
 * is enqueued, also only after K2 started (on a GPU that ranks of one process share, the copy can wait in a
 * hardware queue behind K1 itself). The host reader raises whatever the word holds at the end. No timeouts (as in
 * agreement.pml): a wait that never passes is a deadlock.
 * Interleavings are sequentially consistent: a release store and the acquire load that sees it are modelled as
 * plain steps in program order.
 *
 * Properties:
 *   - the fields a reader sees with a nonzero code are those of the one failure that claimed the word (assert in
 *     Reader);
 *   - a K2 that starts after K1 gave its call up starts on a stopped rank (assert in Stream): otherwise it would
 *     post and announce for a call its peers may be out of step with (agreement.pml, NOTE [kernels behind a
 *     failure]);
 *   - no deadlock: K1's wait ends whenever the host publishes, even if the peer never signals, and the host
 *     waits for nothing.
 *
 * @run host_failure                    safety  pass
 * @run MUTANT_GIVE_UP_UNMARKED         safety  assert
 *        a wait that ends on the host's code does not mark the rank stopped: K1 gives up, K2 starts before the
 *        host's copy of the flag lands and runs its call
 * @run MUTANT_MARK_AFTER_CLAIM         safety  assert
 *        a failing thread marks the rank stopped only when it wins the claim: its claim loses to the host's, K1
 *        ends, and K2 starts before the host's copy lands
 * @run MUTANT_HOST_WAITS_FOR_COPY      safety  deadlock
 *        the host waits for its copy of the flag before it publishes the code, and the copy waits behind K1 in a
 *        shared hardware queue: K1 waits for the code, the code for the copy, the copy for K1
 * @run MUTANT_HOST_NO_CLAIM            safety  assert
 *        the host writes the word without winning the claim: its fields mix with a kernel's failure
 * @run MUTANT_HOST_STOP_ONLY           safety  deadlock
 *        the host marks the rank stopped but publishes no code: K1, already running, never looks at the flag
 *        and waits for a peer that never signals
 */

#define NONE 0
#define MISMATCH 9     /* a kernel's failure (kErrorPlanMismatch) */
#define HOST_CODE 12   /* the host's (kErrorAborted; kErrorPeerExited and kErrorRevoked alike) */

bool claimed, stopped;
byte code = NONE;      /* published last, with release */
byte who = NONE;       /* a field: the code of the failure that filled it */
bool peer_signals;     /* chosen in init: whether the peer ever signals K1 */
bool kernel_fails;     /* chosen in init: whether K1 may record a failure of its own */
bool host_done, stream_done;
bool copy_enqueued, copy_landed, k1_done;
bool queued_behind_k1; /* chosen in init: whether the host's copy waits in a hardware queue behind K1 */

/* publish_failure */
proctype Host() {
#ifdef MUTANT_HOST_WAITS_FOR_COPY
  copy_enqueued = true;
  copy_landed;         /* cudaStreamSynchronize on the copy */
#endif
#ifdef MUTANT_HOST_NO_CLAIM
  claimed = true;
#else
  atomic { if :: !claimed -> claimed = true :: else -> goto enqueue fi }
#endif
#ifdef MUTANT_HOST_STOP_ONLY
  goto enqueue;
#endif
  who = HOST_CODE;
  code = HOST_CODE;
enqueue:
  copy_enqueued = true;
  host_done = true
}

/* The copy engine: the host's copy of the flag lands at some time after it is enqueued. In a shared hardware
 * queue it may wait until K1 has ended (queued_behind_k1, chosen in init). */
proctype StopCopy() {
  copy_enqueued;
  if :: queued_behind_k1 -> k1_done :: else -> skip fi;
  stopped = true;
  copy_landed = true
}

/* mark_stopped */
inline mark_stopped() {
  stopped = true
}

/* record_error by a thread of K1: claim_fatal_word (stopped, claim), the fields, the code */
inline kernel_records_failure() {
#ifndef MUTANT_MARK_AFTER_CLAIM
  mark_stopped();
#endif
  atomic { if :: !claimed -> claimed = true; failed_own = true :: else -> skip fi }
  if
  :: failed_own ->
#ifdef MUTANT_MARK_AFTER_CLAIM
     mark_stopped();
#endif
     who = MISMATCH; code = MISMATCH
  :: else -> skip
  fi
}

proctype Stream() {
  bool gave_up = false, failed_own = false;
  /* K1's wait: the peer's signal, a failure of its own, or another failure in the word */
  if
  :: peer_signals -> skip
  :: kernel_fails -> kernel_records_failure(); gave_up = true
  :: code != NONE ->
#ifndef MUTANT_GIVE_UP_UNMARKED
     mark_stopped();
#endif
     gave_up = true
  fi;
  k1_done = true;
  /* K2 starts once K1 has ended */
  assert(!gave_up || stopped);
  stream_done = true
}

proctype Reader() {
  (host_done && stream_done);
  if
  :: code != NONE -> assert(who == code)
  :: else -> skip
  fi
}

init {
  if :: peer_signals = true :: peer_signals = false fi;
  if :: kernel_fails = true :: kernel_fails = false fi;
  if :: queued_behind_k1 = true :: queued_behind_k1 = false fi;
  atomic { run Host(); run StopCopy(); run Stream(); run Reader() }
}
