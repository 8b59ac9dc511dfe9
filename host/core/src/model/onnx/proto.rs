//! The ONNX protobuf messages (`onnx.proto`, package `onnx`, as of onnx 1.22.0, IR version 13),
//! written out by hand as `prost` structs so that no build script or `protoc` is needed.
//!
//! Field numbers, wire types and packing match `onnx.proto` exactly, so any `.onnx` file (a
//! serialized [`ModelProto`]) or `.pb` test tensor (a serialized [`TensorProto`]) decodes with
//! [`prost::Message::decode`]. The layout follows what `prost-build` would generate for the
//! proto2 file: `optional` scalars and strings are `Option<_>` (with getter methods returning
//! the default when unset), enum-typed fields are `Option<i32>` with typed getters and setters,
//! message fields are `Option<_>` (boxed where the type is recursive), and nested messages and
//! enums live in a snake-case module named after their parent message.
//!
//! Fields that `onnx.proto` declares as plain `int32` even though they hold a
//! [`tensor_proto::DataType`] code (`TensorProto.data_type`, `TypeProto.Tensor.elem_type`, ...)
//! stay plain `Option<i32>` here, as in the schema.

#![allow(clippy::doc_markdown)]

/// Versions of the IR format (`onnx.Version`). `IR_VERSION` is the current one.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash, PartialOrd, Ord, prost::Enumeration)]
#[repr(i32)]
pub enum Version {
    StartVersion = 0,
    IrVersion20171010 = 1,
    IrVersion20171030 = 2,
    IrVersion2017113 = 3,
    IrVersion2019122 = 4,
    IrVersion2019318 = 5,
    IrVersion2019919 = 6,
    IrVersion202058 = 7,
    IrVersion2021730 = 8,
    IrVersion202355 = 9,
    IrVersion2024325 = 10,
    IrVersion20250512 = 11,
    IrVersion20250826 = 12,
    IrVersion = 13,
}

/// Status of an operator set or function (`onnx.OperatorStatus`).
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash, PartialOrd, Ord, prost::Enumeration)]
#[repr(i32)]
pub enum OperatorStatus {
    Experimental = 0,
    Stable = 1,
}

/// A named attribute of a node or function: exactly one value, of the kind `type` names.
#[derive(Clone, PartialEq, prost::Message)]
pub struct AttributeProto {
    #[prost(string, optional, tag = "1")]
    pub name: Option<String>,
    /// Set in a function body when the attribute refers to an attribute of the function.
    #[prost(string, optional, tag = "21")]
    pub ref_attr_name: Option<String>,
    #[prost(string, optional, tag = "13")]
    pub doc_string: Option<String>,
    #[prost(enumeration = "attribute_proto::AttributeType", optional, tag = "20")]
    pub r#type: Option<i32>,
    #[prost(float, optional, tag = "2")]
    pub f: Option<f32>,
    #[prost(int64, optional, tag = "3")]
    pub i: Option<i64>,
    /// UTF-8 string.
    #[prost(bytes = "vec", optional, tag = "4")]
    pub s: Option<Vec<u8>>,
    #[prost(message, optional, tag = "5")]
    pub t: Option<TensorProto>,
    #[prost(message, optional, tag = "6")]
    pub g: Option<GraphProto>,
    #[prost(message, optional, tag = "22")]
    pub sparse_tensor: Option<SparseTensorProto>,
    #[prost(message, optional, tag = "14")]
    pub tp: Option<TypeProto>,
    #[prost(float, repeated, packed = "false", tag = "7")]
    pub floats: Vec<f32>,
    #[prost(int64, repeated, packed = "false", tag = "8")]
    pub ints: Vec<i64>,
    /// UTF-8 strings.
    #[prost(bytes = "vec", repeated, tag = "9")]
    pub strings: Vec<Vec<u8>>,
    #[prost(message, repeated, tag = "10")]
    pub tensors: Vec<TensorProto>,
    #[prost(message, repeated, tag = "11")]
    pub graphs: Vec<GraphProto>,
    #[prost(message, repeated, tag = "23")]
    pub sparse_tensors: Vec<SparseTensorProto>,
    #[prost(message, repeated, tag = "15")]
    pub type_protos: Vec<TypeProto>,
}

/// Nested types of [`AttributeProto`].
pub mod attribute_proto {
    /// Which value field of an [`AttributeProto`](super::AttributeProto) is in use.
    #[derive(Clone, Copy, Debug, PartialEq, Eq, Hash, PartialOrd, Ord, prost::Enumeration)]
    #[repr(i32)]
    pub enum AttributeType {
        Undefined = 0,
        Float = 1,
        Int = 2,
        String = 3,
        Tensor = 4,
        Graph = 5,
        SparseTensor = 11,
        TypeProto = 13,
        Floats = 6,
        Ints = 7,
        Strings = 8,
        Tensors = 9,
        Graphs = 10,
        SparseTensors = 12,
        TypeProtos = 14,
    }
}

/// The name and type of a value (graph input, output or intermediate).
#[derive(Clone, PartialEq, prost::Message)]
pub struct ValueInfoProto {
    #[prost(string, optional, tag = "1")]
    pub name: Option<String>,
    #[prost(message, optional, tag = "2")]
    pub r#type: Option<TypeProto>,
    #[prost(string, optional, tag = "3")]
    pub doc_string: Option<String>,
    #[prost(message, repeated, tag = "4")]
    pub metadata_props: Vec<StringStringEntryProto>,
}

/// One node of a graph: a call of an operator (or function) on named values.
#[derive(Clone, PartialEq, prost::Message)]
pub struct NodeProto {
    #[prost(string, repeated, tag = "1")]
    pub input: Vec<String>,
    #[prost(string, repeated, tag = "2")]
    pub output: Vec<String>,
    #[prost(string, optional, tag = "3")]
    pub name: Option<String>,
    #[prost(string, optional, tag = "4")]
    pub op_type: Option<String>,
    /// Empty (or unset) means the default domain `ai.onnx`.
    #[prost(string, optional, tag = "7")]
    pub domain: Option<String>,
    #[prost(string, optional, tag = "8")]
    pub overload: Option<String>,
    #[prost(message, repeated, tag = "5")]
    pub attribute: Vec<AttributeProto>,
    #[prost(string, optional, tag = "6")]
    pub doc_string: Option<String>,
    #[prost(message, repeated, tag = "9")]
    pub metadata_props: Vec<StringStringEntryProto>,
    #[prost(message, repeated, tag = "10")]
    pub device_configurations: Vec<NodeDeviceConfigurationProto>,
}

/// A key with a list of integers (`onnx.IntIntListEntryProto`).
#[derive(Clone, PartialEq, prost::Message)]
pub struct IntIntListEntryProto {
    #[prost(int64, optional, tag = "1")]
    pub key: Option<i64>,
    #[prost(int64, repeated, packed = "false", tag = "2")]
    pub value: Vec<i64>,
}

/// How a node is distributed over the devices of a [`DeviceConfigurationProto`].
#[derive(Clone, PartialEq, prost::Message)]
pub struct NodeDeviceConfigurationProto {
    #[prost(string, optional, tag = "1")]
    pub configuration_id: Option<String>,
    #[prost(message, repeated, tag = "2")]
    pub sharding_spec: Vec<ShardingSpecProto>,
    #[prost(int32, optional, tag = "3")]
    pub pipeline_stage: Option<i32>,
}

/// How one tensor of a node is sharded across devices.
#[derive(Clone, PartialEq, prost::Message)]
pub struct ShardingSpecProto {
    #[prost(string, optional, tag = "1")]
    pub tensor_name: Option<String>,
    #[prost(int64, repeated, packed = "false", tag = "2")]
    pub device: Vec<i64>,
    #[prost(message, repeated, tag = "3")]
    pub index_to_device_group_map: Vec<IntIntListEntryProto>,
    #[prost(message, repeated, tag = "4")]
    pub sharded_dim: Vec<ShardedDimProto>,
}

/// The sharding of one axis of a tensor.
#[derive(Clone, PartialEq, prost::Message)]
pub struct ShardedDimProto {
    #[prost(int64, optional, tag = "1")]
    pub axis: Option<i64>,
    #[prost(message, repeated, tag = "2")]
    pub simple_sharding: Vec<SimpleShardedDimProto>,
}

/// An even split of (part of) an axis into `num_shards` shards.
#[derive(Clone, PartialEq, prost::Message)]
pub struct SimpleShardedDimProto {
    #[prost(int64, optional, tag = "3")]
    pub num_shards: Option<i64>,
    #[prost(oneof = "simple_sharded_dim_proto::Dim", tags = "1, 2")]
    pub dim: Option<simple_sharded_dim_proto::Dim>,
}

/// Nested types of [`SimpleShardedDimProto`].
pub mod simple_sharded_dim_proto {
    /// The size of the sharded dimension: a number or a symbolic name.
    #[derive(Clone, PartialEq, prost::Oneof)]
    pub enum Dim {
        #[prost(int64, tag = "1")]
        DimValue(i64),
        #[prost(string, tag = "2")]
        DimParam(String),
    }
}

/// Training information: an initialization graph and an algorithm (training step) graph.
#[derive(Clone, PartialEq, prost::Message)]
pub struct TrainingInfoProto {
    #[prost(message, optional, tag = "1")]
    pub initialization: Option<GraphProto>,
    #[prost(message, optional, tag = "2")]
    pub algorithm: Option<GraphProto>,
    #[prost(message, repeated, tag = "3")]
    pub initialization_binding: Vec<StringStringEntryProto>,
    #[prost(message, repeated, tag = "4")]
    pub update_binding: Vec<StringStringEntryProto>,
}

/// A whole model: the top-level message of an `.onnx` file.
#[derive(Clone, PartialEq, prost::Message)]
pub struct ModelProto {
    #[prost(int64, optional, tag = "1")]
    pub ir_version: Option<i64>,
    #[prost(message, repeated, tag = "8")]
    pub opset_import: Vec<OperatorSetIdProto>,
    #[prost(string, optional, tag = "2")]
    pub producer_name: Option<String>,
    #[prost(string, optional, tag = "3")]
    pub producer_version: Option<String>,
    #[prost(string, optional, tag = "4")]
    pub domain: Option<String>,
    #[prost(int64, optional, tag = "5")]
    pub model_version: Option<i64>,
    #[prost(string, optional, tag = "6")]
    pub doc_string: Option<String>,
    #[prost(message, optional, tag = "7")]
    pub graph: Option<GraphProto>,
    #[prost(message, repeated, tag = "14")]
    pub metadata_props: Vec<StringStringEntryProto>,
    #[prost(message, repeated, tag = "20")]
    pub training_info: Vec<TrainingInfoProto>,
    #[prost(message, repeated, tag = "25")]
    pub functions: Vec<FunctionProto>,
    #[prost(message, repeated, tag = "26")]
    pub configuration: Vec<DeviceConfigurationProto>,
}

/// A named set of devices that nodes can be distributed over.
#[derive(Clone, PartialEq, prost::Message)]
pub struct DeviceConfigurationProto {
    #[prost(string, optional, tag = "1")]
    pub name: Option<String>,
    #[prost(int32, optional, tag = "2")]
    pub num_devices: Option<i32>,
    #[prost(string, repeated, tag = "3")]
    pub device: Vec<String>,
}

/// A string-to-string map entry (metadata, external data locations, bindings).
#[derive(Clone, PartialEq, prost::Message)]
pub struct StringStringEntryProto {
    #[prost(string, optional, tag = "1")]
    pub key: Option<String>,
    #[prost(string, optional, tag = "2")]
    pub value: Option<String>,
}

/// Quantization parameters of one tensor, by the names of the tensors that hold them.
#[derive(Clone, PartialEq, prost::Message)]
pub struct TensorAnnotation {
    #[prost(string, optional, tag = "1")]
    pub tensor_name: Option<String>,
    #[prost(message, repeated, tag = "2")]
    pub quant_parameter_tensor_names: Vec<StringStringEntryProto>,
}

/// A graph: nodes in topological order, with its inputs, outputs and initializers.
#[derive(Clone, PartialEq, prost::Message)]
pub struct GraphProto {
    #[prost(message, repeated, tag = "1")]
    pub node: Vec<NodeProto>,
    #[prost(string, optional, tag = "2")]
    pub name: Option<String>,
    #[prost(message, repeated, tag = "5")]
    pub initializer: Vec<TensorProto>,
    #[prost(message, repeated, tag = "15")]
    pub sparse_initializer: Vec<SparseTensorProto>,
    #[prost(string, optional, tag = "10")]
    pub doc_string: Option<String>,
    #[prost(message, repeated, tag = "11")]
    pub input: Vec<ValueInfoProto>,
    #[prost(message, repeated, tag = "12")]
    pub output: Vec<ValueInfoProto>,
    #[prost(message, repeated, tag = "13")]
    pub value_info: Vec<ValueInfoProto>,
    #[prost(message, repeated, tag = "14")]
    pub quantization_annotation: Vec<TensorAnnotation>,
    #[prost(message, repeated, tag = "16")]
    pub metadata_props: Vec<StringStringEntryProto>,
}

/// A dense tensor: dims, element type and data, held in exactly one of the `*_data` fields,
/// in `raw_data` (little-endian, C order), or in external files (`data_location = EXTERNAL`).
#[derive(Clone, PartialEq, prost::Message)]
pub struct TensorProto {
    #[prost(int64, repeated, packed = "false", tag = "1")]
    pub dims: Vec<i64>,
    /// A [`tensor_proto::DataType`] code.
    #[prost(int32, optional, tag = "2")]
    pub data_type: Option<i32>,
    #[prost(message, optional, tag = "3")]
    pub segment: Option<tensor_proto::Segment>,
    #[prost(float, repeated, packed = "true", tag = "4")]
    pub float_data: Vec<f32>,
    #[prost(int32, repeated, packed = "true", tag = "5")]
    pub int32_data: Vec<i32>,
    #[prost(bytes = "vec", repeated, tag = "6")]
    pub string_data: Vec<Vec<u8>>,
    #[prost(int64, repeated, packed = "true", tag = "7")]
    pub int64_data: Vec<i64>,
    #[prost(string, optional, tag = "8")]
    pub name: Option<String>,
    #[prost(string, optional, tag = "12")]
    pub doc_string: Option<String>,
    /// Decoded from a [`bytes::Bytes`] buffer (a model file), a slice of it: no copy.
    #[prost(bytes = "bytes", optional, tag = "9")]
    pub raw_data: Option<bytes::Bytes>,
    /// For `data_location = EXTERNAL`: keys `location`, `offset`, `length`, `checksum`.
    #[prost(message, repeated, tag = "13")]
    pub external_data: Vec<StringStringEntryProto>,
    #[prost(enumeration = "tensor_proto::DataLocation", optional, tag = "14")]
    pub data_location: Option<i32>,
    #[prost(double, repeated, packed = "true", tag = "10")]
    pub double_data: Vec<f64>,
    #[prost(uint64, repeated, packed = "true", tag = "11")]
    pub uint64_data: Vec<u64>,
    #[prost(message, repeated, tag = "16")]
    pub metadata_props: Vec<StringStringEntryProto>,
}

/// Nested types of [`TensorProto`].
pub mod tensor_proto {
    /// Element types (`TensorProto.DataType`).
    #[derive(Clone, Copy, Debug, PartialEq, Eq, Hash, PartialOrd, Ord, prost::Enumeration)]
    #[repr(i32)]
    pub enum DataType {
        Undefined = 0,
        Float = 1,
        Uint8 = 2,
        Int8 = 3,
        Uint16 = 4,
        Int16 = 5,
        Int32 = 6,
        Int64 = 7,
        String = 8,
        Bool = 9,
        Float16 = 10,
        Double = 11,
        Uint32 = 12,
        Uint64 = 13,
        Complex64 = 14,
        Complex128 = 15,
        Bfloat16 = 16,
        Float8e4m3fn = 17,
        Float8e4m3fnuz = 18,
        Float8e5m2 = 19,
        Float8e5m2fnuz = 20,
        Uint4 = 21,
        Int4 = 22,
        Float4e2m1 = 23,
        Float8e8m0 = 24,
        Uint2 = 25,
        Int2 = 26,
    }

    /// A slice `[begin, end)` of a tensor that was split over several `TensorProto`s.
    #[derive(Clone, PartialEq, prost::Message)]
    pub struct Segment {
        #[prost(int64, optional, tag = "1")]
        pub begin: Option<i64>,
        #[prost(int64, optional, tag = "2")]
        pub end: Option<i64>,
    }

    /// Where a tensor's data is stored.
    #[derive(Clone, Copy, Debug, PartialEq, Eq, Hash, PartialOrd, Ord, prost::Enumeration)]
    #[repr(i32)]
    pub enum DataLocation {
        Default = 0,
        External = 1,
    }
}

/// A sequence value (`onnx-data.proto`), as ONNX test data stores one.
#[derive(Clone, PartialEq, prost::Message)]
pub struct SequenceProto {
    #[prost(string, optional, tag = "1")]
    pub name: Option<String>,
    /// 1 tensor, 2 sparse tensor, 3 sequence, 4 map, 5 optional.
    #[prost(int32, optional, tag = "2")]
    pub elem_type: Option<i32>,
    #[prost(message, repeated, tag = "3")]
    pub tensor_values: Vec<TensorProto>,
    #[prost(message, repeated, tag = "4")]
    pub sparse_tensor_values: Vec<SparseTensorProto>,
    #[prost(message, repeated, tag = "5")]
    pub sequence_values: Vec<SequenceProto>,
    #[prost(message, repeated, tag = "6")]
    pub map_values: Vec<MapProto>,
    #[prost(message, repeated, tag = "7")]
    pub optional_values: Vec<OptionalProto>,
}

/// A map value (`onnx-data.proto`).
#[derive(Clone, PartialEq, prost::Message)]
pub struct MapProto {
    #[prost(string, optional, tag = "1")]
    pub name: Option<String>,
    #[prost(int32, optional, tag = "2")]
    pub key_type: Option<i32>,
    #[prost(int64, repeated, packed = "false", tag = "3")]
    pub keys: Vec<i64>,
    #[prost(bytes = "vec", repeated, tag = "4")]
    pub string_keys: Vec<Vec<u8>>,
    #[prost(message, optional, tag = "5")]
    pub values: Option<SequenceProto>,
}

/// An optional value (`onnx-data.proto`).
#[derive(Clone, PartialEq, prost::Message)]
pub struct OptionalProto {
    #[prost(string, optional, tag = "1")]
    pub name: Option<String>,
    #[prost(int32, optional, tag = "2")]
    pub elem_type: Option<i32>,
    #[prost(message, optional, tag = "3")]
    pub tensor_value: Option<TensorProto>,
    #[prost(message, optional, tag = "4")]
    pub sparse_tensor_value: Option<SparseTensorProto>,
    #[prost(message, optional, boxed, tag = "5")]
    pub sequence_value: Option<Box<SequenceProto>>,
    #[prost(message, optional, boxed, tag = "6")]
    pub map_value: Option<Box<MapProto>>,
    #[prost(message, optional, boxed, tag = "7")]
    pub optional_value: Option<Box<OptionalProto>>,
}

/// A sparse tensor in COO form.
#[derive(Clone, PartialEq, prost::Message)]
pub struct SparseTensorProto {
    /// The non-zero values, a 1-D tensor of length NNZ (its name is the sparse tensor's name).
    #[prost(message, optional, tag = "1")]
    pub values: Option<TensorProto>,
    /// INT64 indices: shape `[NNZ, rank]` or linearized `[NNZ]`.
    #[prost(message, optional, tag = "2")]
    pub indices: Option<TensorProto>,
    #[prost(int64, repeated, packed = "false", tag = "3")]
    pub dims: Vec<i64>,
}

/// A tensor shape: one entry per dimension, each known, symbolic or unknown.
#[derive(Clone, PartialEq, prost::Message)]
pub struct TensorShapeProto {
    #[prost(message, repeated, tag = "1")]
    pub dim: Vec<tensor_shape_proto::Dimension>,
}

/// Nested types of [`TensorShapeProto`].
pub mod tensor_shape_proto {
    /// One dimension of a shape.
    #[derive(Clone, PartialEq, prost::Message)]
    pub struct Dimension {
        #[prost(string, optional, tag = "3")]
        pub denotation: Option<String>,
        /// `None` for an unknown dimension.
        #[prost(oneof = "dimension::Value", tags = "1, 2")]
        pub value: Option<dimension::Value>,
    }

    /// Nested types of [`Dimension`].
    pub mod dimension {
        /// A dimension's size: a number or a symbolic name.
        #[derive(Clone, PartialEq, prost::Oneof)]
        pub enum Value {
            #[prost(int64, tag = "1")]
            DimValue(i64),
            #[prost(string, tag = "2")]
            DimParam(String),
        }
    }
}

/// The type of a value: a tensor, sequence, map, optional or sparse tensor.
#[derive(Clone, PartialEq, prost::Message)]
pub struct TypeProto {
    #[prost(string, optional, tag = "6")]
    pub denotation: Option<String>,
    #[prost(oneof = "type_proto::Value", tags = "1, 4, 5, 9, 8")]
    pub value: Option<type_proto::Value>,
}

/// Nested types of [`TypeProto`].
pub mod type_proto {
    /// A dense tensor type.
    #[derive(Clone, PartialEq, prost::Message)]
    pub struct Tensor {
        /// A [`DataType`](super::tensor_proto::DataType) code.
        #[prost(int32, optional, tag = "1")]
        pub elem_type: Option<i32>,
        #[prost(message, optional, tag = "2")]
        pub shape: Option<super::TensorShapeProto>,
    }

    /// A sequence of values of one type.
    #[derive(Clone, PartialEq, prost::Message)]
    pub struct Sequence {
        #[prost(message, optional, boxed, tag = "1")]
        pub elem_type: Option<Box<super::TypeProto>>,
    }

    /// A map from a tensor element type to values of one type.
    #[derive(Clone, PartialEq, prost::Message)]
    pub struct Map {
        /// A [`DataType`](super::tensor_proto::DataType) code (an integer type or STRING).
        #[prost(int32, optional, tag = "1")]
        pub key_type: Option<i32>,
        #[prost(message, optional, boxed, tag = "2")]
        pub value_type: Option<Box<super::TypeProto>>,
    }

    /// A value that may be absent.
    #[derive(Clone, PartialEq, prost::Message)]
    pub struct Optional {
        #[prost(message, optional, boxed, tag = "1")]
        pub elem_type: Option<Box<super::TypeProto>>,
    }

    /// A sparse tensor type.
    #[derive(Clone, PartialEq, prost::Message)]
    pub struct SparseTensor {
        /// A [`DataType`](super::tensor_proto::DataType) code.
        #[prost(int32, optional, tag = "1")]
        pub elem_type: Option<i32>,
        #[prost(message, optional, tag = "2")]
        pub shape: Option<super::TensorShapeProto>,
    }

    /// Which kind of type a [`TypeProto`](super::TypeProto) is.
    #[derive(Clone, PartialEq, prost::Oneof)]
    pub enum Value {
        #[prost(message, tag = "1")]
        TensorType(Tensor),
        #[prost(message, tag = "4")]
        SequenceType(Sequence),
        #[prost(message, tag = "5")]
        MapType(Map),
        #[prost(message, tag = "9")]
        OptionalType(Optional),
        #[prost(message, tag = "8")]
        SparseTensorType(SparseTensor),
    }
}

/// An operator set a model or function imports: a domain and its version.
#[derive(Clone, PartialEq, prost::Message)]
pub struct OperatorSetIdProto {
    /// Empty (or unset) means the default domain `ai.onnx`.
    #[prost(string, optional, tag = "1")]
    pub domain: Option<String>,
    #[prost(int64, optional, tag = "2")]
    pub version: Option<i64>,
}

/// A model-local function: a graph of nodes callable as an operator `domain::name`.
#[derive(Clone, PartialEq, prost::Message)]
pub struct FunctionProto {
    #[prost(string, optional, tag = "1")]
    pub name: Option<String>,
    #[prost(string, repeated, tag = "4")]
    pub input: Vec<String>,
    #[prost(string, repeated, tag = "5")]
    pub output: Vec<String>,
    /// Names of attributes without defaults.
    #[prost(string, repeated, tag = "6")]
    pub attribute: Vec<String>,
    /// Attributes with defaults.
    #[prost(message, repeated, tag = "11")]
    pub attribute_proto: Vec<AttributeProto>,
    #[prost(message, repeated, tag = "7")]
    pub node: Vec<NodeProto>,
    #[prost(string, optional, tag = "8")]
    pub doc_string: Option<String>,
    #[prost(message, repeated, tag = "9")]
    pub opset_import: Vec<OperatorSetIdProto>,
    #[prost(string, optional, tag = "10")]
    pub domain: Option<String>,
    #[prost(string, optional, tag = "13")]
    pub overload: Option<String>,
    #[prost(message, repeated, tag = "12")]
    pub value_info: Vec<ValueInfoProto>,
    #[prost(message, repeated, tag = "14")]
    pub metadata_props: Vec<StringStringEntryProto>,
}

#[cfg(test)]
mod tests {
    use super::*;
    use prost::Message;
    use std::path::{Path, PathBuf};

    fn tensor_value_info(name: &str, elem_type: i32, dims: &[i64]) -> ValueInfoProto {
        ValueInfoProto {
            name: Some(name.to_owned()),
            r#type: Some(TypeProto {
                denotation: None,
                value: Some(type_proto::Value::TensorType(type_proto::Tensor {
                    elem_type: Some(elem_type),
                    shape: Some(TensorShapeProto {
                        dim: dims
                            .iter()
                            .map(|&d| tensor_shape_proto::Dimension {
                                denotation: None,
                                value: Some(if d < 0 {
                                    tensor_shape_proto::dimension::Value::DimParam("N".into())
                                } else {
                                    tensor_shape_proto::dimension::Value::DimValue(d)
                                }),
                            })
                            .collect(),
                    }),
                })),
            }),
            ..Default::default()
        }
    }

    fn small_model() -> ModelProto {
        let weight = TensorProto {
            dims: vec![2, 2],
            data_type: Some(tensor_proto::DataType::Float as i32),
            name: Some("w".into()),
            raw_data: Some(
                [1.0f32, 2.0, 3.0, 4.0]
                    .iter()
                    .flat_map(|v| v.to_le_bytes())
                    .collect(),
            ),
            ..Default::default()
        };
        let mut transpose = AttributeProto {
            name: Some("transB".into()),
            i: Some(1),
            ..Default::default()
        };
        transpose.set_type(attribute_proto::AttributeType::Int);
        let alpha = AttributeProto {
            name: Some("alpha".into()),
            r#type: Some(attribute_proto::AttributeType::Float as i32),
            f: Some(0.5),
            ..Default::default()
        };
        let seq_type = TypeProto {
            denotation: None,
            value: Some(type_proto::Value::SequenceType(type_proto::Sequence {
                elem_type: Some(Box::new(tensor_value_info("_", 7, &[3]).r#type.unwrap())),
            })),
        };
        ModelProto {
            ir_version: Some(8),
            opset_import: vec![OperatorSetIdProto {
                domain: Some(String::new()),
                version: Some(17),
            }],
            producer_name: Some("epx-test".into()),
            graph: Some(GraphProto {
                name: Some("g".into()),
                node: vec![NodeProto {
                    input: vec!["x".into(), "w".into()],
                    output: vec!["y".into()],
                    op_type: Some("Gemm".into()),
                    attribute: vec![transpose, alpha],
                    ..Default::default()
                }],
                initializer: vec![weight],
                input: vec![tensor_value_info("x", 1, &[-1, 2])],
                output: vec![tensor_value_info("y", 1, &[-1, 2])],
                value_info: vec![ValueInfoProto {
                    name: Some("s".into()),
                    r#type: Some(seq_type),
                    ..Default::default()
                }],
                ..Default::default()
            }),
            metadata_props: vec![StringStringEntryProto {
                key: Some("k".into()),
                value: Some("v".into()),
            }],
            ..Default::default()
        }
    }

    #[test]
    fn model_round_trips() {
        let model = small_model();
        let bytes = model.encode_to_vec();
        let back = ModelProto::decode(bytes.as_slice()).expect("decode");
        assert_eq!(back, model);
        assert_eq!(back.ir_version(), 8);
        assert_eq!(back.domain(), "");
        let graph = back.graph.as_ref().unwrap();
        assert_eq!(
            graph.node[0].attribute[0].r#type(),
            attribute_proto::AttributeType::Int
        );
        assert_eq!(graph.node[0].attribute[1].f(), 0.5);
        assert_eq!(
            graph.initializer[0].data_location(),
            tensor_proto::DataLocation::Default
        );
    }

    #[test]
    fn wire_format_matches_onnx_proto() {
        // ModelProto.ir_version is field 1 (varint): tag byte 0x08.
        let m = ModelProto {
            ir_version: Some(7),
            ..Default::default()
        };
        assert_eq!(m.encode_to_vec(), vec![0x08, 7]);
        // TensorProto.dims (field 1) is not packed in proto2: one tag per element.
        let t = TensorProto {
            dims: vec![2, 3],
            ..Default::default()
        };
        assert_eq!(t.encode_to_vec(), vec![0x08, 2, 0x08, 3]);
        // TensorProto.float_data (field 4) is declared [packed = true].
        let t = TensorProto {
            float_data: vec![1.0],
            ..Default::default()
        };
        assert_eq!(t.encode_to_vec(), vec![0x22, 4, 0, 0, 0x80, 0x3f]);
        // AttributeProto.type is field 20 (varint): tag 0xa0 0x01.
        let mut a = AttributeProto::default();
        a.set_type(attribute_proto::AttributeType::Ints);
        assert_eq!(a.encode_to_vec(), vec![0xa0, 0x01, 7]);
        // TypeProto.optional_type is field 9 in the oneof.
        let tp = TypeProto {
            denotation: None,
            value: Some(type_proto::Value::OptionalType(type_proto::Optional {
                elem_type: None,
            })),
        };
        assert_eq!(tp.encode_to_vec(), vec![0x4a, 0]);
    }

    #[test]
    fn packed_and_unpacked_both_decode() {
        // dims written packed (field 1, length-delimited) still decodes.
        let t = TensorProto::decode(&[0x0a, 2, 2, 3][..]).expect("decode");
        assert_eq!(t.dims, vec![2, 3]);
    }

    fn testdata_dir() -> PathBuf {
        Path::new(env!("CARGO_MANIFEST_DIR")).join("../../.testdata/onnx-node")
    }

    /// Whether `input_K.pb` / `output_K.pb` of `graph` holds a `TensorProto` (the other test
    /// cases store an `onnx.SequenceProto` or `onnx.OptionalProto`, from `onnx-data.proto`).
    fn holds_tensor(graph: &GraphProto, file_name: &str) -> bool {
        let (values, index) = if let Some(k) = file_name.strip_prefix("input_") {
            (&graph.input, k)
        } else if let Some(k) = file_name.strip_prefix("output_") {
            (&graph.output, k)
        } else {
            return true;
        };
        let Some(index) = index
            .strip_suffix(".pb")
            .and_then(|k| k.parse::<usize>().ok())
        else {
            return true;
        };
        values
            .get(index)
            .and_then(|v| v.r#type.as_ref())
            .is_none_or(|t| matches!(t.value, Some(type_proto::Value::TensorType(_))))
    }

    #[test]
    fn decodes_onnx_node_test_data() {
        let dir = testdata_dir();
        if !dir.is_dir() {
            println!(
                "skipped: {} is absent (run tests/fetch-testdata.sh to fetch it)",
                dir.display()
            );
            return;
        }
        let mut cases: Vec<PathBuf> = std::fs::read_dir(&dir)
            .unwrap()
            .map(|e| e.unwrap().path())
            .filter(|p| p.join("model.onnx").is_file())
            .collect();
        cases.sort();
        let (mut models, mut tensors, mut non_tensors, mut reencoded_same) = (0, 0, 0, 0);
        let mut failures = Vec::new();
        for case in &cases {
            let path = case.join("model.onnx");
            let bytes = std::fs::read(&path).unwrap();
            let model = match ModelProto::decode(bytes.as_slice()) {
                Ok(m) => m,
                Err(e) => {
                    failures.push(format!("{}: {e}", path.display()));
                    continue;
                }
            };
            models += 1;
            // onnx writes fields in field-number order, as prost does, so a schema mismatch
            // (wrong number, wire type or packing) shows up as a byte difference.
            if model.encode_to_vec() == bytes {
                reencoded_same += 1;
            } else {
                failures.push(format!("{}: re-encoding differs", path.display()));
            }
            let Some(graph) = model.graph.as_ref() else {
                failures.push(format!("{}: no graph", path.display()));
                continue;
            };
            let mut sets: Vec<PathBuf> = std::fs::read_dir(case)
                .unwrap()
                .map(|e| e.unwrap().path())
                .filter(|p| {
                    p.is_dir()
                        && p.file_name()
                            .and_then(|n| n.to_str())
                            .is_some_and(|n| n.starts_with("test_data_set_"))
                })
                .collect();
            sets.sort();
            for set in sets {
                let mut files: Vec<PathBuf> = std::fs::read_dir(&set)
                    .unwrap()
                    .map(|e| e.unwrap().path())
                    .filter(|p| p.extension().is_some_and(|e| e == "pb"))
                    .collect();
                files.sort();
                for file in files {
                    let name = file.file_name().unwrap().to_string_lossy().into_owned();
                    if !holds_tensor(graph, &name) {
                        non_tensors += 1;
                        continue;
                    }
                    let bytes = std::fs::read(&file).unwrap();
                    match TensorProto::decode(bytes.as_slice()) {
                        Ok(t) if t.encode_to_vec() == bytes => tensors += 1,
                        Ok(_) => failures.push(format!("{}: re-encoding differs", file.display())),
                        Err(e) => failures.push(format!("{}: {e}", file.display())),
                    }
                }
            }
        }
        println!(
            "decoded {models} models ({reencoded_same} re-encode byte for byte) and {tensors} \
             tensors from {}; skipped {non_tensors} sequence/optional .pb files",
            dir.display()
        );
        assert!(
            failures.is_empty(),
            "{} failed:\n{}",
            failures.len(),
            failures.join("\n")
        );
        assert!(models > 0, "no model.onnx under {}", dir.display());
    }
}
