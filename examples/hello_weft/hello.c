/* hello_weft: every rank sends its rank to both ring neighbours and checks what arrives. */
#include <stdio.h>
#include <weft/weft.h>

#define CHECK(call)                                                          \
  do {                                                                       \
    weftResult_t r_ = (call);                                                \
    if (r_ != weftSuccess) {                                                 \
      fprintf(stderr, "%s failed: %s (%s)\n", #call, weftGetErrorString(r_), \
              weftGetLastError(NULL));                                       \
      return 1;                                                              \
    }                                                                        \
  } while (0)

int main(void) {
  weftComm_t comm;
  int rank, size;
  CHECK(weftCommInitFromEnv(&comm, NULL));
  CHECK(weftCommUserRank(comm, &rank));
  CHECK(weftCommCount(comm, &size));
  int left = (rank + size - 1) % size, right = (rank + 1) % size;
  int from_left = -1, from_right = -1;
  /* Grouped so that every rank can send before anyone receives without deadlock. */
  CHECK(weftGroupStart());
  CHECK(weftSend(&rank, 1, weftInt32, left, comm, NULL));
  CHECK(weftSend(&rank, 1, weftInt32, right, comm, NULL));
  CHECK(weftRecv(&from_left, 1, weftInt32, left, comm, NULL));
  CHECK(weftRecv(&from_right, 1, weftInt32, right, comm, NULL));
  CHECK(weftGroupEnd());
  int ok = from_left == left && from_right == right;
  printf("hello from rank %d of %d: got %d from left, %d from right: %s\n", rank, size, from_left,
         from_right, ok ? "ok" : "WRONG");
  CHECK(weftCommDestroy(comm));
  return ok ? 0 : 1;
}
