/* Exits 0 if this machine can execute AMX tile instructions.
 *
 * Used by build_cpp_server.sh: VMs often advertise AMX in CPUID (so
 * -march=native enables ggml's AMX kernels) while the hypervisor does not
 * enable the tile state, and the first AMX instruction raises SIGILL. */
#include <immintrin.h>
#include <string.h>
#include <sys/syscall.h>
#include <unistd.h>

struct tilecfg {
    unsigned char palette_id;
    unsigned char start_row;
    unsigned char reserved[14];
    unsigned short colsb[16];
    unsigned char rows[16];
};

int main(void) {
    /* ARCH_REQ_XCOMP_PERM for XFEATURE_XTILEDATA, as ggml does. */
    if (syscall(SYS_arch_prctl, 0x1023, 18)) {
        return 2;
    }
    struct tilecfg cfg;
    memset(&cfg, 0, sizeof cfg);
    cfg.palette_id = 1;
    cfg.rows[0] = 16;
    cfg.colsb[0] = 64;
    _tile_loadconfig(&cfg);
    _tile_zero(0);
    _tile_release();
    return 0;
}
