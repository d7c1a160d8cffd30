/* The exposure of a buffer nobody registered (NOTE [automatic exposures]): an owner's buffer that two VMM
 * allocations back, which the program unmaps and maps anew under it when it likes, and a peer whose kernels reach
 * the buffer through the mapping of the exposure the owner announces for each call. Whatever the program does
 * with the memory between calls, every call's peer access lands in the very allocations the owner's buffer maps
 * at that call.
 *
 * Models (file:function):
 *   src/memory/registered_exposures.cpp: RegisteredExposures::find_or_expose (an exposure that holds the buffer is
 *     used only while BackingPages::unchanged, else dropped and the buffer exposed anew), drop_automatic (waits for
 *     this rank's calls to end, then withdraws: the peer releases its mapping before the owner goes on)
 *   src/memory/paged_ranges.cpp: BackingPages::find (each allocation retained, its handle kept), unchanged (the
 *     handle of the allocation mapped at each page now, compared with the kept one), ~BackingPages (releases)
 *   src/memory/exposure_importer.cpp: CudaExposureImporter::import_pages / release (the peer maps every allocation
 *     of the list and holds it until withdrawn)
 *   the CUDA driver's handles: cuMemCreate gives a handle value no live allocation of the process holds; one
 *   that every holder of the process released may be given again (a peer's import lives in another process)
 *   the program (PyTorch's caching allocator): it unmaps an allocation only once its calls on it ended (its
 *   stream order and record_stream), then maps a new one at the same address
 *
 * One owner, one peer. The owner makes CALLS eager calls: the first on the whole buffer (its exposure holds both
 * pages), the others on the buffer or on a tensor inside one page of it (which that exposure holds too). Between
 * them the program may replace the allocation of a page that no queued call touches (REPLACES times in all). Each
 * call carries the allocations of the owner's pages at the call (a ghost, the truth) beside the exposure id it
 * announces; the peer's kernel of that call reaches the pages it touches through its mapping of that id later
 * (calls queue, as enqueued work does). Interleavings are sequentially consistent: the host's steps are plain
 * steps in program order.
 *
 * Properties (asserts where the peer's kernel touches the buffer):
 *   - the exposure the call announced is still mapped at the peer (not withdrawn under a queued call);
 *   - its mapping holds, page by page, the allocations the owner's buffer mapped at that call.
 *
 * @run real                          safety  pass
 * @run MUTANT_NO_RETAIN              safety  assert
 *        the exposure keeps the handles but does not retain the allocations: once the program releases one, a
 *        new allocation may get its handle value, the check passes, and the peer writes into the old memory
 * @run MUTANT_FIRST_PAGE_ONLY        safety  assert
 *        the check compares the first allocation's handle only: a replaced second page goes unnoticed
 * @run MUTANT_NO_CHECK               safety  assert
 *        a found exposure is used without the check: any replacement goes unnoticed
 * @run MUTANT_NO_WAIT                safety  assert
 *        a changed exposure is withdrawn without waiting for this rank's calls: the peer releases the mapping of
 *        a page that a queued call on a tensor of the other page still touches
 */

#define PAGES 2
#define CALLS 4
#define REPLACES 2
#define ALLOCATIONS 5   /* the first two, then one a replacement (index 0: none) */
#define HANDLES 5       /* handle values the driver can give (0: none) */
#define IDS 4           /* exposure ids ever made: the first, then one a replacement (0: none) */

byte page[PAGES];                  /* the allocation mapped at each page of the owner's buffer */
byte handle_of[ALLOCATIONS];       /* each allocation's handle value in the owner's process */
bool program_holds[ALLOCATIONS];   /* the program's own reference */
bool braid_holds[ALLOCATIONS];     /* braid's retained one (owner side) */
byte allocations_made;

/* The owner's automatic exposure of the buffer (one entry: the buffer is the only one). */
byte exposed_id;                   /* 0: none */
byte kept_handle[PAGES];           /* the handles BackingPages::find kept */
byte kept_allocation[PAGES];       /* ghost: the allocations it found */
byte next_id = 1;

/* The peer's mappings: imported[id * PAGES + p], the allocation it maps for page p of exposure id (0: released). */
byte imported[IDS * PAGES + PAGES];

/* A call: the exposure id announced, the pages it touches (1: page 0, 2: page 1, 3: both), and the allocations
 * of pages 0 and 1 at the call (a ghost). */
chan calls = [CALLS] of { byte, byte, byte, byte };
byte uses[PAGES];                  /* queued calls that touch each page */
byte in_flight;                    /* queued calls */

/* cuMemCreate: a new allocation, whose handle value no allocation of this process still held takes. */
inline create_allocation(made) {
  allocations_made++;
  made = allocations_made;
  h = 1;
  do
  :: h < HANDLES ->
       taken = false;
       a = 1;
       do
       :: a <= allocations_made && a != made ->
            if :: (program_holds[a] || braid_holds[a]) && handle_of[a] == h -> taken = true :: else -> skip fi;
            a++
       :: else -> break
       od;
       if :: !taken -> break :: else -> h++ fi
  :: else -> break
  od;
  handle_of[made] = h;
  program_holds[made] = true
}

/* drop_automatic: after this rank's calls ended, the peer releases its mappings; braid releases its handles. */
inline drop_exposure() {
#ifndef MUTANT_NO_WAIT
  (in_flight == 0);
#endif
  p = 0;
  do
  :: p < PAGES -> imported[exposed_id * PAGES + p] = 0; braid_holds[kept_allocation[p]] = false; p++
  :: else -> break
  od;
  exposed_id = 0
}

/* BackingPages::find, then the exposure: the peer's helper maps every allocation before the owner goes on. */
inline expose() {
  p = 0;
  do
  :: p < PAGES ->
       kept_allocation[p] = page[p];
       kept_handle[p] = handle_of[page[p]];
#ifndef MUTANT_NO_RETAIN
       braid_holds[page[p]] = true;
#endif
       p++
  :: else -> break
  od;
  exposed_id = next_id;
  next_id++;
  p = 0;
  do
  :: p < PAGES -> imported[exposed_id * PAGES + p] = page[p]; p++
  :: else -> break
  od
}

/* find_or_expose: an exposure that holds the buffer is used while every allocation is unchanged. */
inline find_or_expose() {
  if
  :: exposed_id != 0 ->
       changed = false;
#ifndef MUTANT_NO_CHECK
       p = 0;
       do
#ifdef MUTANT_FIRST_PAGE_ONLY
       :: p < 1 ->
#else
       :: p < PAGES ->
#endif
            if :: handle_of[page[p]] != kept_handle[p] -> changed = true :: else -> skip fi;
            p++
       :: else -> break
       od;
#endif
       if :: changed -> drop_exposure() :: else -> skip fi
  :: else -> skip
  fi;
  if :: exposed_id == 0 -> expose() :: else -> skip fi
}

inline queue_call(touches) {
  find_or_expose();
  atomic {
    in_flight++;
    if :: touches & 1 -> uses[0]++ :: else -> skip fi;
    if :: touches & 2 -> uses[1]++ :: else -> skip fi;
    calls ! exposed_id, touches, page[0], page[1]
  }
}

proctype Owner() {
  byte made_calls = 0, replaced = 0, p, a, h, made, touches;
  bool taken, changed;
  queue_call(3);  /* the first call is on the whole buffer: its exposure holds both pages */
  made_calls++;
  do
  :: made_calls < CALLS ->
       /* the buffer, or a tensor inside one page of it, which the exposure holds as well */
       if :: touches = 1 :: touches = 2 :: touches = 3 fi;
       queue_call(touches);
       made_calls++
  :: replaced < REPLACES ->
       /* the program unmaps the allocation of a page no queued call touches, releases it, maps a new one there */
       if :: uses[0] == 0 -> p = 0 :: uses[1] == 0 -> p = 1 fi;
       program_holds[page[p]] = false;
       create_allocation(made);
       page[p] = made;
       replaced++
  :: made_calls == CALLS -> break
  od
}

/* The peer's kernels, one a call in order: they reach the pages the call touches through the mapping of its id. */
proctype Peer() {
  byte id, touches, at0, at1;
end:
  do
  :: calls ? id, touches, at0, at1 ->
       if
       :: touches & 1 -> assert(imported[id * PAGES] != 0); assert(imported[id * PAGES] == at0)
       :: else -> skip
       fi;
       if
       :: touches & 2 -> assert(imported[id * PAGES + 1] != 0); assert(imported[id * PAGES + 1] == at1)
       :: else -> skip
       fi;
       atomic {
         if :: touches & 1 -> uses[0]-- :: else -> skip fi;
         if :: touches & 2 -> uses[1]-- :: else -> skip fi;
         in_flight--
       }
  od
}

init {
  byte made, a, h;
  bool taken;
  atomic {
    create_allocation(made); page[0] = made;
    create_allocation(made); page[1] = made;
    run Owner(); run Peer()
  }
}
