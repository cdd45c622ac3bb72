/* A host program built against the installed libklrt, the way a user would
 * (find_package(klrt), pkg-config), shared or static, compiled as C and as
 * C++. Reads a spec; needs no GPU. */
#include <klrt/klrt.h>
#include <stdio.h>
#include <string.h>

int main(int argc, char **argv) {
  kl_info i = KL_INFO_INIT;
  kl_config cfg = KL_CONFIG_INIT; /* what a caller fills in, no NCCL header needed */
  cfg.nccl = NULL;
  if (argc != 2 || kl_spec_info_file(argv[1], NULL, &i) != KLRT_OK) {
    fprintf(stderr, "install_consumer: %s\n", kl_last_error());
    return 1;
  }
  printf("%s: shard %lld, %d ranks; GPUs: %d; config %zu bytes\n", i.name, i.shard, i.tp,
         kl_device_count(), cfg.size);
  return strcmp(i.name, "kimi_k3_tp8") == 0 && i.shard == 20480 ? 0 : 1;
}
