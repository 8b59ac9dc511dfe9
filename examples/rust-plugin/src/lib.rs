//! `toy`, an EP in Rust: float32 Relu, and Add of two tensors of one static shape.
use epx_plugin_api::sdk::*;
use epx_plugin_api::{ElementType, export_plugin};

struct ToyFactory;
impl ProviderFactory for ToyFactory {
    fn info(&self) -> ProviderInfo {
        ProviderInfo::host_memory("toy", "epx examples", env!("CARGO_PKG_VERSION"))
    }
    fn create(&self, options: ProviderOptions) -> Result<Box<dyn Provider>> {
        options.finish()?; // it takes no options: any key given is an error
        Ok(Box::new(Toy))
    }
}

struct Toy;
impl Provider for Toy {
    fn capability(&self, g: &GraphView<'_>, unclaimed: &[u32]) -> Result<Vec<Vec<u32>>> {
        g.claim_each(unclaimed, |n| {
            let shape = |i: usize| g.static_shape(n.inputs[i]?, ElementType::Float);
            Ok(match (n.domain, n.op_type, n.inputs.len()) {
                ("", "Relu", 1) => shape(0).is_some(),
                ("", "Add", 2) => shape(0).is_some() && shape(0) == shape(1),
                _ => false,
            })
        })
    }
    fn compile(&self, g: &GraphView<'_>, sub: &SubgraphView<'_>) -> Result<Box<dyn Kernel>> {
        let add = g.node(sub.nodes[0])?.op_type == "Add";
        Ok(Box::new(ToyKernel { add }))
    }
}

struct ToyKernel {
    add: bool,
}
impl Kernel for ToyKernel {
    fn execute(&self, ctx: &mut KernelContext<'_>) -> Result<()> {
        let (x, shape) = ctx.input_as::<f32>(0)?;
        let y = if self.add {
            ctx.input_as::<f32>(1)?.0
        } else {
            x
        };
        let out = ctx.output_as::<f32>(0, shape)?;
        for ((o, &a), &b) in out.iter_mut().zip(x).zip(y) {
            *o = if self.add {
                a + b
            } else if a < 0.0 {
                0.0
            } else {
                a
            };
        }
        Ok(())
    }
}

export_plugin!(name: "toy", version: env!("CARGO_PKG_VERSION"), providers: [ToyFactory]);
