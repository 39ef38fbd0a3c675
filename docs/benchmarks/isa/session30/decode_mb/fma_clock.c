#include <stdio.h>
#include <time.h>
static double now(){struct timespec a; clock_gettime(CLOCK_MONOTONIC,&a); return a.tv_sec+a.tv_nsec*1e-9;}
int main(){
  long n=1000000000L, x=0;
  double t=now();
  for(long i=0;i<n;i++){ __asm__ volatile("add $1, %0\n\tadd $1, %0\n\tadd $1, %0\n\tadd $1, %0" : "+r"(x)); }
  double dt=now()-t; printf("4 dep adds/iter: %.2f GHz (x=%ld)\n", 4.0*n/dt, x);
  t=now();
  for(long i=0;i<n/4;i++){ __asm__ volatile(
   "vfmadd231ps %%zmm1,%%zmm2,%%zmm3\n\tvfmadd231ps %%zmm1,%%zmm2,%%zmm4\n\tvfmadd231ps %%zmm1,%%zmm2,%%zmm5\n\tvfmadd231ps %%zmm1,%%zmm2,%%zmm6\n\t"
   "vfmadd231ps %%zmm1,%%zmm2,%%zmm7\n\tvfmadd231ps %%zmm1,%%zmm2,%%zmm8\n\tvfmadd231ps %%zmm1,%%zmm2,%%zmm9\n\tvfmadd231ps %%zmm1,%%zmm2,%%zmm10\n\t"
   "vfmadd231ps %%zmm1,%%zmm2,%%zmm11\n\tvfmadd231ps %%zmm1,%%zmm2,%%zmm12\n\tvfmadd231ps %%zmm1,%%zmm2,%%zmm13\n\tvfmadd231ps %%zmm1,%%zmm2,%%zmm14\n\t"
   ::: "xmm3","xmm4","xmm5","xmm6","xmm7","xmm8","xmm9","xmm10","xmm11","xmm12","xmm13","xmm14");}
  dt=now()-t; printf("zmm fma: %.2f G/s\n", 12.0*(n/4)/dt/1e9);
  t=now();
  for(long i=0;i<n/4;i++){ __asm__ volatile(
   "vfmadd231ps %%zmm1,%%zmm2,%%zmm3\n\tvfmadd231ps %%zmm1,%%zmm3,%%zmm3\n\tvfmadd231ps %%zmm1,%%zmm2,%%zmm3\n\tvfmadd231ps %%zmm1,%%zmm2,%%zmm3\n\t" ::: "xmm3");}
  dt=now()-t; printf("zmm fma latency chain: %.2f G fma/s\n", 4.0*(n/4)/dt/1e9);
}
