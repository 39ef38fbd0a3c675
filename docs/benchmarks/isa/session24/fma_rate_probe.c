#include <stdio.h>
#include <time.h>
#include <immintrin.h>
static double now(){struct timespec a; clock_gettime(CLOCK_MONOTONIC,&a); return a.tv_sec+a.tv_nsec*1e-9;}
int main(){
  __m512 c[16]; for(int i=0;i<16;i++) c[i]=_mm512_set1_ps(1.0f+i*1e-3f); __m512 m=_mm512_set1_ps(0.999999f), ad=_mm512_set1_ps(1e-7f);
  double t=now();
  for(unsigned long i=0;i<100000000UL;i++){
    __asm__ volatile(
     "vfmadd213ps %[ad], %[m], %[c0]\n vfmadd213ps %[ad], %[m], %[c1]\n vfmadd213ps %[ad], %[m], %[c2]\n vfmadd213ps %[ad], %[m], %[c3]\n"
     "vfmadd213ps %[ad], %[m], %[c4]\n vfmadd213ps %[ad], %[m], %[c5]\n vfmadd213ps %[ad], %[m], %[c6]\n vfmadd213ps %[ad], %[m], %[c7]\n"
     "vfmadd213ps %[ad], %[m], %[c8]\n vfmadd213ps %[ad], %[m], %[c9]\n vfmadd213ps %[ad], %[m], %[c10]\n vfmadd213ps %[ad], %[m], %[c11]\n"
     : [c0]"+v"(c[0]),[c1]"+v"(c[1]),[c2]"+v"(c[2]),[c3]"+v"(c[3]),[c4]"+v"(c[4]),[c5]"+v"(c[5]),[c6]"+v"(c[6]),[c7]"+v"(c[7]),[c8]"+v"(c[8]),[c9]"+v"(c[9]),[c10]"+v"(c[10]),[c11]"+v"(c[11])
     : [m]"v"(m),[ad]"v"(ad));
  }
  double s=now()-t; printf("zmm FMA: %.2f G/s\n", 1.2e9/s/1e9);
  __m512bh a=(__m512bh)_mm512_set1_epi32(0x3f803f80), b=a;
  t=now();
  for(unsigned long i=0;i<100000000UL;i++){
    __asm__ volatile(
     "vdpbf16ps %[b], %[a], %[c0]\n vdpbf16ps %[b], %[a], %[c1]\n vdpbf16ps %[b], %[a], %[c2]\n vdpbf16ps %[b], %[a], %[c3]\n"
     "vdpbf16ps %[b], %[a], %[c4]\n vdpbf16ps %[b], %[a], %[c5]\n vdpbf16ps %[b], %[a], %[c6]\n vdpbf16ps %[b], %[a], %[c7]\n"
     "vdpbf16ps %[b], %[a], %[c8]\n vdpbf16ps %[b], %[a], %[c9]\n vdpbf16ps %[b], %[a], %[c10]\n vdpbf16ps %[b], %[a], %[c11]\n"
     : [c0]"+v"(c[0]),[c1]"+v"(c[1]),[c2]"+v"(c[2]),[c3]"+v"(c[3]),[c4]"+v"(c[4]),[c5]"+v"(c[5]),[c6]"+v"(c[6]),[c7]"+v"(c[7]),[c8]"+v"(c[8]),[c9]"+v"(c[9]),[c10]"+v"(c[10]),[c11]"+v"(c[11])
     : [a]"v"(a),[b]"v"(b));
  }
  s=now()-t; printf("zmm vdpbf16ps: %.2f G/s\n", 1.2e9/s/1e9);
  float r=0; for(int j=0;j<12;j++) r+=_mm512_reduce_add_ps(c[j]); printf("%f\n", r);
}
