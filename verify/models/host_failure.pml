/* A failure the host publishes in a rank's fatal error word (a peer's exit, abort, revoke) beside the failures
 * that rank's kernels record in it: one failure wins the word whole, every wait of the rank ends, and a kernel
 * that starts behind a call its stream abandoned never runs that call's successor as if nothing happened.
 *
 * Models (file:function):
 *   src/sync/device_sync.cpp: DeviceSync::publish_failure (mark the rank stopped through a copy it waits for,
 *     claim the word with a compare-and-swap, fill the fields, publish the code with a release)
 *   include/braid/device/sync_device.hpp: record_error via claim_fatal_word (claim, mark stopped, fields,
 *     publish), spin_until (gives up once the word's code is nonzero), rank_stopped and NOTE [stopped ranks]
 *     (a kernel that starts on a stopped rank acts on nothing)
 *   src/sync/device_sync.cpp: DeviceSync::raise_recorded_error (reads the code with acquire, then the fields)
 *
 * One rank. Its stream runs K1, whose wait passes when the peer signals (which may never happen) or gives up once
 * the word holds a failure, then K2, which starts only after K1 ended (stream order) and reads the stopped flag
 * at its start. In some runs K1 also records a failure of its own (a mismatch its wait answers). The host
 * publishes a failure at any time (the watch thread, or abort). The host reader raises whatever the word holds at
 * the end. No timeouts (as in agreement.pml): a wait that never passes is a deadlock.
 * Interleavings are sequentially consistent: a release store and the acquire load that sees it are modelled as
 * plain steps in program order.
 *
 * Properties:
 *   - the fields a reader sees with a nonzero code are those of the one failure that claimed the word (assert in
 *     Reader);
 *   - a K2 that starts after K1 gave its call up starts on a stopped rank (assert in Stream): otherwise it would
 *     post and announce for a call its peers may be out of step with (agreement.pml, NOTE [kernels behind a
 *     failure]);
 *   - no deadlock: K1's wait ends whenever the host publishes, even if the peer never signals.
 *
 * @run host_failure                    safety  pass
 * @run MUTANT_STOP_AFTER_CODE          safety  assert
 *        the host publishes the code before it marks the rank stopped: K1 gives up, K2 starts before the flag
 *        lands and runs its call
 * @run MUTANT_STOP_AFTER_CLAIM         safety  assert
 *        the host marks the rank stopped after its claim, as a kernel does: a thread of K1 that fails on its own
 *        loses the claim to the host and ends K1 before the flag lands (a kernel's claimer is a thread of K1,
 *        so K1 cannot end before its own claimer sets the flag; the host is no thread of K1)
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

/* publish_failure */
proctype Host() {
#if !defined(MUTANT_STOP_AFTER_CODE) && !defined(MUTANT_STOP_AFTER_CLAIM)
  stopped = true;      /* the copy of the flag, synchronised before anything else */
#endif
#ifdef MUTANT_HOST_NO_CLAIM
  claimed = true;
#else
  atomic { if :: !claimed -> claimed = true :: else -> goto done fi }
#endif
#ifdef MUTANT_STOP_AFTER_CLAIM
  stopped = true;
#endif
#ifdef MUTANT_HOST_STOP_ONLY
  goto done;
#endif
  who = HOST_CODE;
  code = HOST_CODE;
#ifdef MUTANT_STOP_AFTER_CODE
  stopped = true;
#endif
done:
  host_done = true
}

/* record_error by a thread of K1: claim_fatal_word (claim, stopped), the fields, the code */
inline kernel_records_failure() {
  atomic { if :: !claimed -> claimed = true; failed_own = true :: else -> skip fi }
  if
  :: failed_own -> stopped = true; who = MISMATCH; code = MISMATCH
  :: else -> skip
  fi
}

proctype Stream() {
  bool gave_up = false, failed_own = false;
  /* K1's wait: the peer's signal, a failure of its own, or another failure in the word */
  if
  :: peer_signals -> skip
  :: kernel_fails -> kernel_records_failure(); gave_up = true
  :: code != NONE -> gave_up = true
  fi;
  /* K2 starts once K1 has ended */
  assert(!gave_up || stopped);
  stream_done = true
}

/* raise_recorded_error once everything ended: the code, then the fields */
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
  atomic { run Host(); run Stream(); run Reader() }
}
