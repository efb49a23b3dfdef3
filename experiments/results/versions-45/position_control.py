import time, numpy as np, jax, jax.numpy as jnp, jaxnorm, jaxnorm_old
shape=(8192,1024); dt=jnp.float32
k=jax.random.split(jax.random.key(0),2)
x=(jax.random.normal(k[0],shape)+2).astype(dt); t=jax.random.normal(k[1],shape).astype(dt)
s=jnp.ones(shape[-1],dt)*1.1; b=jnp.zeros(shape[-1],dt)+0.1; a=jnp.asarray(0.5,dt)
def mk(m): return jax.jit(jax.grad(lambda x,s,b,t: jnp.sum(m.dyt(x,a,s,b).astype(jnp.float32)*t),(0,1,2)))
def clock(fn,k):
  t0=time.process_time()
  for _ in range(k): out=fn(x,s,b,t)
  jax.block_until_ready(out); return (time.process_time()-t0)/k
for label, fns in [("old,new", {"A":mk(jaxnorm_old),"B":mk(jaxnorm)}), ("new,old", {"A":mk(jaxnorm),"B":mk(jaxnorm_old)}), ("new,new", {"A":mk(jaxnorm),"B":mk(jaxnorm)})]:
  for f in fns.values(): jax.block_until_ready(f(x,s,b,t))
  smp={n:[] for n in fns}
  for _ in range(15):
    for n,f in fns.items(): smp[n].append(clock(f,3))
  print(label, "B/A", round(float(np.median(np.array(smp["B"])/np.array(smp["A"]))),3), "A ms", round(1e3*np.median(smp["A"]),2))
