/* Peak issue rate of the AVX-512 dot-product instructions on this CPU, per core and on two cores: twelve
 * independent accumulator chains of one instruction (vpdpbusd, vpdpwssd, vdpbf16ps, vfmadd231ps, vpmaddubsw),
 * registers only, so the figure is the execution ports' throughput, the ceiling a GEMM on that instruction has.
 *
 * Build and run (benchmarks/engine-cpu.md records the figures):
 *     gcc -O2 -pthread kernels/bench/cpu_dot_peak.c -o /tmp/cpu_dot_peak && /tmp/cpu_dot_peak
 * Inline asm, because GCC 12 compiles the intrinsics of a dot product with a register copy per instruction. */
#define _POSIX_C_SOURCE 200809L
#include <stdio.h>
#include <time.h>
#include <pthread.h>
static double now(){struct timespec t;clock_gettime(CLOCK_MONOTONIC,&t);return t.tv_sec+t.tv_nsec*1e-9;}
#define ITERS 50000000L
#define R12(op) op " %%zmm0,%%zmm1,%%zmm4\n" op " %%zmm0,%%zmm1,%%zmm5\n" op " %%zmm0,%%zmm1,%%zmm6\n" op " %%zmm0,%%zmm1,%%zmm7\n" op " %%zmm0,%%zmm1,%%zmm8\n" op " %%zmm0,%%zmm1,%%zmm9\n" op " %%zmm0,%%zmm1,%%zmm10\n" op " %%zmm0,%%zmm1,%%zmm11\n" op " %%zmm0,%%zmm1,%%zmm12\n" op " %%zmm0,%%zmm1,%%zmm13\n" op " %%zmm0,%%zmm1,%%zmm14\n" op " %%zmm0,%%zmm1,%%zmm15\n"
#define LOOP(op) __asm__ volatile("vpxord %%zmm0,%%zmm0,%%zmm0\n vpxord %%zmm1,%%zmm1,%%zmm1\n mov %0,%%rcx\n1:\n" R12(op) "dec %%rcx\n jnz 1b\n"::"r"(ITERS):"rcx","xmm0","xmm1","xmm4","xmm5","xmm6","xmm7","xmm8","xmm9","xmm10","xmm11","xmm12","xmm13","xmm14","xmm15")
typedef struct {int kind; double t;} arg_t;
static void* run(void *p){ arg_t *a=p; double t0=now();
 switch(a->kind){case 0: LOOP("vpdpbusd"); break; case 1: LOOP("vpdpwssd"); break; case 2: LOOP("vdpbf16ps"); break; case 3: LOOP("vfmadd231ps"); break; case 4: LOOP("vpmaddubsw");break;}
 a->t=now()-t0; return 0;}
int main(){ const char* names[]={"vpdpbusd (64 int8 MAC)","vpdpwssd (32 int16 MAC)","vdpbf16ps (32 bf16 MAC)","vfmadd231ps (16 f32 MAC)","vpmaddubsw(64 MAC, i16 out)"}; int macs[]={64,32,32,16,64};
  for(int th=1;th<=2;th++) for(int k=0;k<5;k++){ pthread_t t[2]; arg_t a[2]; for(int i=0;i<th;i++){a[i].kind=k;pthread_create(&t[i],0,run,&a[i]);} double tm=0; for(int i=0;i<th;i++){pthread_join(t[i],0); if(a[i].t>tm)tm=a[i].t;}
   double ins=(double)ITERS*12*th; printf("%d thr %-28s %.2f G instr/s  %.1f GMAC/s (%.0f G ops/s)\n",th,names[k],ins/tm*1e-9,ins*macs[k]/tm*1e-9,2*ins*macs[k]/tm*1e-9);}
}
