/* An executable's start, bound to glibc 2.28's __libc_start_main (see
 * glibc_2_28.c). Since glibc 2.34 the startup code (crt1.o) calls
 * __libc_start_main@GLIBC_2.34 with no init function, and libc runs the
 * program's constructors itself; an older glibc runs only the init function it
 * is given. So the call goes to the GLIBC_2.2.5 version with an init function
 * that runs them as the startup code of glibc < 2.34 did (_init, then
 * .init_array), which every glibc then calls. */
#include <stddef.h>

typedef int (*kl_main_fn)(int, char **, char **);
typedef void (*kl_init_fn)(int, char **, char **);

int kl_glibc_old___libc_start_main(kl_main_fn main, int argc, char **argv, kl_init_fn init,
                                   void (*fini)(void), void (*rtld_fini)(void), void *stack_end);
__asm__(".symver kl_glibc_old___libc_start_main, __libc_start_main@GLIBC_2.2.5");

extern void _init(void);
extern kl_init_fn __init_array_start[] __attribute__((visibility("hidden")));
extern kl_init_fn __init_array_end[] __attribute__((visibility("hidden")));

static void run_constructors(int argc, char **argv, char **envp) {
  _init();
  size_t n = (size_t)(__init_array_end - __init_array_start);
  for (size_t i = 0; i < n; i++) __init_array_start[i](argc, argv, envp);
}

__attribute__((visibility("hidden"))) int
__wrap___libc_start_main(kl_main_fn main, int argc, char **argv, kl_init_fn init,
                         void (*fini)(void), void (*rtld_fini)(void), void *stack_end) {
  return kl_glibc_old___libc_start_main(main, argc, argv, init ? init : run_constructors, fini,
                                        rtld_fini, stack_end);
}
