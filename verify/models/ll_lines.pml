/* LL and LL128 flag-in-data lines: two parities, a flag per call, re-stamping, and the flag's wrap-around.
 *
 * Models (file:function):
 *   src/kernels/ll.cuh: ll_call (sequence = LL calls so far + 1, flag = sequence cut to the flag's width,
 *     parity = sequence & 1, re-stamping calls = sequence mod kLLRestampPeriod < 2), count_ll_call, ll_slot,
 *     restamp_unwritten_lines
 *   include/braid/device/ll_device.hpp: store_wire, load_wire (a line is two 8-byte halves, each landing whole
 *     and each carrying the flag)
 *   src/kernels/reduce_ll.cu: reduce_ll (every rank sends `lines` lines to every peer and polls every peer's)
 *   src/kernels/broadcast_ll.cu: broadcast_ll (-DBROADCAST: the root sends the lines, every other rank a token
 *     line to every peer; every rank polls the root's lines and the other non-roots' tokens); the token is the
 *     non-root's plan line (ll.cuh, NOTE [plan lines]). The code's other plan lines (the root's, and every
 *     sender's in reduce_ll) are lines every sender writes in every call and every receiver polls: they follow
 *     the parity argument as the lines modelled here do, the re-stamping leaves them alone, and they add waits
 *     only, so the model leaves them out.
 *   src/kernels/all_reduce_ll128.cu, ll128.cuh: poll_groups (-DLL128: a 64-bit flag in the line's last
 *     part, no re-stamping; the line lands whole)
 *   src/kernels/launch_counter.cuh: read_launch_counter, advance_once_read (the sequence lives in device
 *     memory and advances once a launch, replays included)
 *
 * Each rank is a process running CALLS calls. A call's length (lines a sender writes into each slot, 1 or 2 of
 * LINES) is chosen at the start, the same on every rank, every combination explored: a long call after short
 * ones polls lines no recent call wrote (WRAP; the default configuration runs short, short, long). Weak ordering: a sender stores a line as two half stores that land one
 * after the other, in either order (an LL128 line lands whole); lines of a sender land in program order, as a
 * poll checks each line by itself. A kernel's stores have landed when it ends. The re-stamping runs before or
 * after the polls, chosen per call (it touches this rank's own area only, so before the stores is the same).
 * Two granularities: the default one (CALLS 4, every half a step, polls line by line) for the races between
 * ranks; -DWRAP (CALLS 9, a rank's stores and its polls each one step) to reach the flag's wrap-around.
 *
 * NOTE [reduced widths]
 *   LL: the flag is the 64-bit sequence cut to 32 bits, and every kLLRestampPeriod = 2^30 calls each rank
 *   re-stamps (with the call's flag) the lines of its own area that the call leaves alone, one call of each
 *   parity. So a line polled in call s carries the flag of s or of a call at most one period older, which
 *   differs from s's flag as long as the period is below 2^32. Here the flag has FLAG_BITS = 3 bits and the
 *   period is RESTAMP_PERIOD = 4: the same argument holds (4 < 8), the zeroed area's flag 0 is the flag of
 *   sequence 8, and WRAP's 9 calls reach it and pass the first wrap (sequence 9 has the flag of sequence 1).
 *   LL128: the flag is the whole 64-bit sequence and never wraps; here it is the sequence itself (at most
 *   CALLS + 1, far below FLAG_MOD). Sequences and call tags are exact integers here (CALLS is small).
 *
 * Properties:
 *   - a poll takes a line only when it holds this call's data from that sender: not a stale line of an earlier
 *     call, not a re-stamped or never-written one, not half of one (assert in take_line);
 *   - before a sender's store, the line does not carry the call's flag already (assert in store_half: a poll
 *     ahead of the store would take it);
 *   - no store or re-stamp rewrites a line its receiver has not polled yet (asserts in store_half, restamp_half);
 *   - no deadlock; every rank finishes every call (ltl all_finish, weak fairness).
 *
 * @run real                        safety         pass
 * @run real_progress               ltl:all_finish pass
 * @run real_wrap                   safety         pass   -DWRAP
 * @run real_broadcast              safety         pass   -DBROADCAST
 * @run real_ll128                  safety         pass   -DLL128
 * @run MUTANT_NO_RESTAMP           safety         assert -DWRAP
 *        the lines a call leaves alone are never re-stamped: a never-written or old line passes for data
 * @run MUTANT_RESTAMP_ONE_PARITY   safety         assert -DWRAP
 *        re-stamping on sequence mod period == 0 alone: one parity is never re-stamped
 * @run MUTANT_RESTAMP_WRITTEN      safety         assert
 *        re-stamping from line 0: it rewrites the lines peers send in this call with empty data
 * @run MUTANT_ONE_HALF_FLAG        safety         assert
 *        load_wire checks the flag of the low half alone: the high half may still be the old line's
 * @run MUTANT_EPOCH_NOT_ADVANCED   safety         assert
 *        count_ll_call skipped (a replay reusing the captured sequence): a call takes the previous call's lines
 * @run MUTANT_ONE_PARITY           safety         assert
 *        one area for every call instead of two parities: a fast sender rewrites lines a peer still polls
 * @run MUTANT_ROOT_SKIPS_TOKENS    safety         assert -DBROADCAST
 *        broadcast's root does not wait for the other ranks' tokens: it runs two calls ahead of a slow peer
 * @run MUTANT_LL128_TORN_LINE      safety         assert -DLL128
 *        LL128 where a line does not land whole (no NVLink, e.g. PCIe): the flag part lands before the payload
 */

#define RANKS 3             /* at least 3: broadcast's non-roots also hear from each other */
#define LINES 2             /* lines of a slot; a call writes 1 or 2 of them into each slot */
#define PARITIES 2          /* faithful to ll_slot: calls alternate two parities */
#ifdef LL128
#define FLAG_MOD 256        /* the whole sequence: never wraps within CALLS */
#else
#define FLAG_BITS 3         /* reduced from 32: NOTE [reduced widths] */
#define FLAG_MOD 8          /* 1 << FLAG_BITS */
#define RESTAMP_PERIOD 4    /* reduced from kLLRestampPeriod = 2^30: NOTE [reduced widths] */
#endif
#ifdef WRAP
#define CALLS 9             /* through the flag's wrap: NOTE [reduced widths] */
#else
#define CALLS 3             /* call k + 2 reuses call k's parity */
#endif

#define wire(receiver, parity, sender, line, half) \
  (((((receiver) * PARITIES + (parity)) * RANKS + (sender)) * LINES + (line)) * 2 + (half))
#define WIRES (RANKS * PARITIES * RANKS * LINES * 2)
#define peer_of(r, k) (((r) + (k)) % RANKS)

/* A half as stored: the tag of the call that wrote it (call + 1; 0: the zeroed area), whether it is a
   re-stamp (empty data), and its flag. */
#define content(tag, restamp, flag) ((tag) * 2 * FLAG_MOD + (restamp) * FLAG_MOD + (flag))
#define flag_of(c) ((c) % FLAG_MOD)
#define restamp_of(c) (((c) / FLAG_MOD) % 2)
#define tag_of(c) ((c) / (2 * FLAG_MOD))

#ifdef LL128
#define CONTENT_TYPE short  /* tags up to CALLS, flags up to 255 */
#else
#define CONTENT_TYPE byte
#endif
CONTENT_TYPE area[WIRES];   /* every rank's LL area: [receiver][parity][sender][line][half] */
bit unread[WIRES];          /* a half stored for its receiver, which has not polled it yet */
byte lines_of[CALLS];       /* lines a call writes into each slot (broadcast: the root's slots) */
byte finished;
byte arrived;               /* WRAP: ranks arrived at the lockstep points so far */

#ifdef MUTANT_ONE_PARITY
#define parity_of(sequence) 0
#else
#define parity_of(sequence) ((sequence) % 2)
#endif

#ifdef BROADCAST
#define root_of(c) ((c) % RANKS)
/* Lines `sender` writes into each peer's slot in call `c`: the root its lines, every other rank a token. */
#define written_lines(c, sender) ((sender) == root_of(c) -> lines_of[c] : 1)
#else
#define written_lines(c, sender) lines_of[c]
#endif

/* One half of line `line` stored into `receiver`'s slot from this rank. What it replaces must have been polled
   (no overwrite of a line the receiver still has to take), and must not carry this call's flag already (else a
   poll ahead of this store would take it). */
inline store_half(receiver, line, half) {
  assert(!unread[wire(receiver, parity, r, line, half)]);
  assert(flag_of(area[wire(receiver, parity, r, line, half)]) != flag);
  area[wire(receiver, parity, r, line, half)] = content(call + 1, 0, flag);
  unread[wire(receiver, parity, r, line, half)] = 1
}

/* store_wire of line `line` to `receiver`: the two halves land one after the other, in either order (an LL128
   line lands whole). */
inline store_line(receiver, line) {
#if defined(LL128) && !defined(MUTANT_LL128_TORN_LINE)
  atomic { store_half(receiver, line, 0); store_half(receiver, line, 1) }
#else
  if
  :: atomic { store_half(receiver, line, 0) }; atomic { store_half(receiver, line, 1) }
  :: atomic { store_half(receiver, line, 1) }; atomic { store_half(receiver, line, 0) }
  fi
#endif
}

/* The flag check of a poll: LL checks both halves (load_wire); LL128 the part that carries the flag (half 1). */
#if defined(LL128)
#define line_ready(sender, line) (flag_of(area[wire(r, parity, sender, line, 1)]) == flag)
#elif defined(MUTANT_ONE_HALF_FLAG)
#define line_ready(sender, line) (flag_of(area[wire(r, parity, sender, line, 0)]) == flag)
#else
#define line_ready(sender, line) (flag_of(area[wire(r, parity, sender, line, 0)]) == flag && \
                                  flag_of(area[wire(r, parity, sender, line, 1)]) == flag)
#endif
#define holds_this_call(sender, line, half) \
  (tag_of(area[wire(r, parity, sender, line, half)]) == call + 1 && \
   restamp_of(area[wire(r, parity, sender, line, half)]) == 0)

/* Takes `sender`'s line `line` once it is ready: it must be whole, this call's data. */
inline take_line(sender, line) {
  assert(holds_this_call(sender, line, 0) && holds_this_call(sender, line, 1));
  unread[wire(r, parity, sender, line, 0)] = 0;
  unread[wire(r, parity, sender, line, 1)] = 0
}

/* The lines this rank polls from `sender` in this call (broadcast: the root's lines, the other non-roots'
   tokens, none from itself; MUTANT_ROOT_SKIPS_TOKENS: a root polls nothing). */
#if defined(BROADCAST) && defined(MUTANT_ROOT_SKIPS_TOKENS)
#define polled_lines(sender) (r == root_of(call) -> 0 : written_lines(call, sender))
#else
#define polled_lines(sender) written_lines(call, sender)
#endif
#define slot_ready(sender) ((polled_lines(sender) < 1 || line_ready(sender, 0)) && \
                            (polled_lines(sender) < 2 || line_ready(sender, 1)))

/* restamp_unwritten_lines: on re-stamping calls, this call's flag with empty data into every line of this
   rank's own area, in this call's parity, that no peer writes in this call. It may run anywhere in the kernel
   (its position is chosen per call). */
#ifdef LL128
#define restamps(sequence) false
#elif defined(MUTANT_NO_RESTAMP)
#define restamps(sequence) false
#elif defined(MUTANT_RESTAMP_ONE_PARITY)
#define restamps(sequence) ((sequence) % RESTAMP_PERIOD == 0)
#else
#define restamps(sequence) ((sequence) % RESTAMP_PERIOD < 2)
#endif
#ifdef MUTANT_RESTAMP_WRITTEN
#define first_unwritten(sender) 0
#else
#define first_unwritten(sender) written_lines(call, sender)
#endif
inline restamp_half(sender, line, half) {
  assert(!unread[wire(r, parity, sender, line, half)]);   /* no line a peer sent in this call */
  area[wire(r, parity, sender, line, half)] = content(0, 1, flag)
}
inline restamp_unwritten_lines() {
  atomic {
    if
    :: restamps(sequence) ->
       k = 1;
       do
       :: k < RANKS ->
          i = first_unwritten(peer_of(r, k));
          do
          :: i < LINES -> restamp_half(peer_of(r, k), i, 0); restamp_half(peer_of(r, k), i, 1); i++
          :: else -> break
          od;
          k++
       :: else -> break
       od
    :: else -> skip
    fi;
    i = 0; k = 0
  }
}
#define restamp_if_here(position) if :: restamp_at == position -> restamp_unwritten_lines() :: else -> skip fi

/* The stores of a call: reduce_ll every line of this rank's block into every peer's slot; broadcast_ll the
   root's lines, every other rank's token (line 0), into every peer's slot. */
inline store_lines() {
  k = 1;
  do
  :: k < RANKS ->
     i = 0;
     do :: i < written_lines(call, r) -> store_line(peer_of(r, k), i); i++ :: else -> break od;
     k++
  :: else -> k = 0; i = 0; break
  od
}

/* ll_call: the sequence from the launch counter, read at the kernel's start. */
inline start_call() {
  sequence = epoch + 1;
  flag = sequence % FLAG_MOD;
  parity = parity_of(sequence)
}

#ifndef MUTANT_EPOCH_NOT_ADVANCED
#define count_ll_call epoch++   /* the launch's last block stores read + 1 */
#else
#define count_ll_call skip
#endif

#ifndef WRAP
proctype Rank(byte r) {
  byte call = 0, epoch = 0, sequence, flag, parity, k, i, restamp_at;
  do
  :: call < CALLS ->
     atomic {
       start_call();
       /* the re-stamping's place: before the polls or after them (before the stores is no different for this
          rank's own area, the only one it touches) */
       if :: restamps(sequence) -> if :: restamp_at = 1 :: restamp_at = 2 fi
          :: else -> restamp_at = 0
       fi
     }
     store_lines();
     count_ll_call;
     restamp_if_here(1);
     /* the polls, one line at a time */
     k = 1;
     do
     :: k < RANKS ->
        i = 0;
        do
        :: i < polled_lines(peer_of(r, k)) -> atomic { line_ready(peer_of(r, k), i) -> take_line(peer_of(r, k), i) }; i++
        :: else -> break
        od;
        k++
     :: else -> k = 0; i = 0; break
     od;
     restamp_if_here(2);
     atomic { call++; restamp_at = 0 }
  :: else -> break
  od;
  finished++
}
#else
/* WRAP: the ranks in lockstep, every rank's stores of a call, then every rank's polls and re-stamping. The
   wrap-around is a matter of which flag a line holds before a call's store (asserted in store_half), which no
   interleaving changes; the races are the default configuration's. */
proctype Rank(byte r) {
  byte call = 0, epoch = 0, sequence, flag, parity, k, i;
  do
  :: call < CALLS ->
     atomic { arrived >= RANKS * 2 * call -> start_call(); store_lines(); count_ll_call; arrived++ }
     atomic {
       arrived >= RANKS * (2 * call + 1) ->
       k = 1;
       do
       :: k < RANKS ->
          i = 0;
          do
          :: i < polled_lines(peer_of(r, k)) -> assert(line_ready(peer_of(r, k), i)); take_line(peer_of(r, k), i); i++
          :: else -> break
          od;
          k++
       :: else -> k = 0; i = 0; break
       od;
       restamp_unwritten_lines();
       arrived++;
       call++
     }
  :: else -> break
  od;
  finished++
}
#endif

init {
  byte c = 0;
  atomic {
#ifdef WRAP
    /* every combination of call lengths: a long call after short ones polls lines no recent call wrote */
    do
    :: c < CALLS -> if :: lines_of[c] = 1 :: lines_of[c] = 2 fi; c++
    :: else -> break
    od;
#else
    /* short, short, long: the re-stamping call (sequence 1) stamps line 1 of parity 1, which its peers write
       again in the third call (sequence 3), racing with nothing only if the protocol holds */
    lines_of[0] = 1; lines_of[1] = 1; lines_of[2] = 2;
#endif
    run Rank(0); run Rank(1); run Rank(2)
  }
}

ltl all_finish { <> (finished == RANKS) }
